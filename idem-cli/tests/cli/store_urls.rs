//! Store URLs: every documented SQLite form opens the database it names (absolute paths stay
//! absolute), an in-memory one is refused, and a password on the command line draws a
//! warning that points at `IDEM_STORE_URL`.

use std::path::Path;

use crate::support::{idem, stderr, stdout, unique, unknown_record, RecordText, TempDb};

/// Lists unknown records of the store `url` names, from `cwd`.
fn list_from(cwd: &Path, url: &str) -> std::process::Output {
    idem()
        .current_dir(cwd)
        .args(["--store", url, "--json", "list", "--state", "unknown"])
        .output()
        .unwrap()
}

fn listed_keys(out: &std::process::Output) -> Vec<String> {
    let page: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", stdout(out), stderr(out)));
    page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sqlite_form_opens_the_database_it_names() {
    // A working directory with nothing in it, so a path wrongly taken as relative to it
    // names no database.
    let elsewhere = std::env::temp_dir().join(unique("idem-cli-cwd"));
    std::fs::create_dir(&elsewhere).unwrap();
    let db = TempDb::new("idem-cli-abs").await;
    let key = unknown_record(&*db.store, &RecordText::plain("abs", "lost")).await;
    let abs = db.path.display().to_string();
    assert!(abs.starts_with('/'));

    for url in [
        format!("sqlite://{abs}"),  // sqlite:///tmp/…
        format!("sqlite:///{abs}"), // sqlite:////tmp/…
        format!("sqlite:{abs}"),
    ] {
        let out = list_from(&elsewhere, &url);
        assert!(out.status.success(), "{url}: {}", stderr(&out));
        assert_eq!(listed_keys(&out), vec![key.to_string()], "{url}");
    }

    // Relative forms resolve against the working directory.
    let here = TempDb::at(elsewhere.join("rel.db")).await;
    let rel_key = unknown_record(&*here.store, &RecordText::plain("rel", "lost")).await;
    for url in ["sqlite://./rel.db", "sqlite://rel.db", "sqlite:rel.db"] {
        let out = list_from(&elsewhere, url);
        assert!(out.status.success(), "{url}: {}", stderr(&out));
        assert_eq!(listed_keys(&out), vec![rel_key.to_string()], "{url}");
    }
    drop(here);
    let _ = std::fs::remove_dir_all(&elsewhere);
}

#[test]
fn unusable_sqlite_urls_are_clear_errors() {
    let cwd = std::env::temp_dir();
    for (url, says) in [
        ("sqlite::memory:", "in-memory"),
        ("sqlite://:memory:", "in-memory"),
        ("sqlite://", "needs a path"),
        ("sqlite:", "needs a path"),
        ("sqlite:///tmp/x.db?mode=ro", "query"),
    ] {
        let out = list_from(&cwd, url);
        assert_eq!(out.status.code(), Some(2), "{url}: {out:?}");
        assert!(stderr(&out).contains(says), "{url}: {}", stderr(&out));
        assert!(stdout(&out).is_empty());
    }
    // Nothing was created on the way.
    assert!(!Path::new(":memory:").exists());
}

#[test]
fn help_documents_the_store_forms_and_the_environment_variable() {
    let out = idem().arg("--help").output().unwrap();
    let help = stdout(&out);
    for form in [
        "sqlite://./REL.db",
        "sqlite:///ABS/PATH.db",
        "sqlite:////ABS/PATH.db",
        "IDEM_STORE_URL",
        "`ps`",
    ] {
        assert!(
            help.contains(form),
            "--help does not mention {form}:\n{help}"
        );
    }
}

/// A URL with a password, given as an argument, draws the warning; the same URL from
/// `IDEM_STORE_URL`, or one without a password, does not. (The stores are unreachable: the
/// warning comes before connecting, and the password never appears in what is printed.)
#[test]
fn a_password_on_the_command_line_draws_a_warning() {
    let with_password = [
        "postgres://alice:s3cret@127.0.0.1:1/idem",
        "postgresql://alice:s3cret@127.0.0.1:1/idem?sslmode=disable",
        "postgres://alice@127.0.0.1:1/idem?password=s3cret",
        "redis://:s3cret@127.0.0.1:1/0",
        "redis://alice:s3cret@127.0.0.1:1",
    ];
    let without = [
        "postgres://alice@127.0.0.1:1/idem",
        "redis://127.0.0.1:1/0",
        "sqlite:///nonexistent/s3cret:x@y.db",
    ];
    // (url, given as an argument?, warning expected?), all run at once: a refused Redis
    // connection takes seconds to give up.
    let mut cases = Vec::new();
    for url in with_password {
        cases.push((url, true, true));
        cases.push((url, false, false));
    }
    for url in without {
        cases.push((url, true, false));
    }
    let running: Vec<_> = cases
        .iter()
        .map(|&(url, as_arg, _)| {
            let mut cmd = idem();
            if as_arg {
                cmd.args(["--store", url]);
            } else {
                cmd.env("IDEM_STORE_URL", url);
            }
            cmd.args(["list", "--state", "unknown"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for ((url, as_arg, warns), child) in cases.into_iter().zip(running) {
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        let warned = err.contains("warning") && err.contains("IDEM_STORE_URL");
        assert_eq!(warned, warns, "{url} (argument: {as_arg}): {err}");
        assert!(!out.status.success(), "{url} is unreachable");
        if warns || !as_arg {
            assert!(!err.contains("s3cret"), "{url}: {err}");
        }
    }
}
