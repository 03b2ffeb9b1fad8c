//! The stock `idem` binary (no tools registered; see the `idem_cli` docs to embed your own).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = idem_cli::Cli::parse();
    idem_cli::run(cli, |store| async move {
        idem_runtime::registry::Registry::builder()
            .shared_store(store)
            .build()
            .expect("an empty registry always builds")
    })
    .await
}
