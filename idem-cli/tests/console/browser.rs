//! A person settles an escalation in a real browser: headless Chromium, driven through
//! chromedriver (WebDriver over plain HTTP on loopback). A real call whose answer is lost
//! is escalated by the reconciler; the person opens the console with its token, finds the
//! record in the list, reads its evidence (with markup in the arguments shown as text),
//! resolves it as completed with a ref through the form and the confirmation page; the
//! page then shows the decision and the operator, and the next call replays the ref's
//! output without running the handler. Screenshots of the record page, before and after,
//! are kept in the test's output directory.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian's `chromium` and
//! `chromium-driver`): without them the test prints why and passes, unless
//! `IDEM_REQUIRE_BROWSER=1` or `IDEM_REQUIRE_BACKENDS=1`, when it fails.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use idem_runtime::escalation::EscalationDetail;
use idem_runtime::{
    call::ToolCall,
    outcome::OutcomeClass,
    reconcile::Reconciler,
    registry::Registry,
    store::RecordState,
    tool::{ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde_json::{json, Value};

use crate::support::{sqlite, unique, Console};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// An unkeyed send without a read-back whose first answer is lost: the reconciler can
/// only escalate it. Counts the sends (the downstream's ledger).
struct Send {
    sends: Arc<AtomicU32>,
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    order: String,
}

impl WriteTool for Send {
    type Args = Args;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("send")
    }
    async fn call(&self, _ctx: WriteCtx, _args: Args) -> Result<Value, ToolError> {
        self.sends.fetch_add(1, Ordering::SeqCst);
        Err(ToolError::unknown("gateway timeout after sending"))
    }
}

/// chromedriver, stopped on drop.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn required() -> bool {
    ["IDEM_REQUIRE_BROWSER", "IDEM_REQUIRE_BACKENDS"]
        .iter()
        .any(|v| std::env::var(v).as_deref() == Ok("1"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts chromedriver on a free loopback port and waits until it accepts connections.
async fn chromedriver() -> (Driver, u16) {
    let port = free_port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let driver = Driver(child);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return (driver, port);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver did not start listening on {addr}");
}

/// Saves a screenshot of the page in the test's output directory.
async fn screenshot(browser: &fantoccini::Client, name: &str) {
    let shot = browser.screenshot().await.unwrap();
    assert!(shot.starts_with(b"\x89PNG"), "a PNG");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&out, &shot).unwrap();
    println!("screenshot: {}", out.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_settles_an_escalation_in_a_browser() {
    if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
        let why = format!(
            "{CHROMIUM} or {CHROMEDRIVER} is missing (apt-get install chromium chromium-driver)"
        );
        assert!(!required(), "the browser test cannot run: {why}");
        println!("skipping the console's browser test: {why}");
        return;
    }

    // A real escalation: the call's answer is lost, the reconciler cannot tell.
    let target = sqlite("console-browser").await;
    let sends = Arc::new(AtomicU32::new(0));
    let registry = Registry::builder()
        .shared_store(target.store.clone())
        .tool(Send {
            sends: sends.clone(),
        })
        .build()
        .unwrap();
    let run = unique("console-browser");
    let order = "o-browser <b>bold</b>";
    let call = || ToolCall::new(run.clone(), "send", json!({ "order": order }));
    let first = registry.call(call()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    let key = first.key().unwrap().clone();
    Reconciler::new(&registry).run_all().await.expect("a pass");
    let escalated = target.store.get(&key).await.unwrap().unwrap();
    assert_eq!(escalated.state, RecordState::Escalated);
    assert_eq!(sends.load(Ordering::SeqCst), 1);

    let console = Console::start(&target.url, &target.options, &["--operator", "ops-browser"]);
    let (_driver, port) = chromedriver().await;
    let profile = std::env::temp_dir().join(unique("console-chromium-profile"));
    let mut caps = serde_json::Map::new();
    caps.insert("browserName".into(), json!("chrome"));
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1280,1150",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    let browser = ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a WebDriver session");

    // The address the console printed: the token sets the cookie and leaves the address.
    browser.goto(&console.url).await.unwrap();
    let url = browser.current_url().await.unwrap();
    assert_eq!(url.path(), "/");
    assert_eq!(url.query(), None, "the token left the address bar");
    let count = browser
        .find(Locator::Css("#count-escalated b"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(count, "1");

    // Found in the list, opened, its evidence read.
    browser
        .find(Locator::Css(&format!(
            "#records a[href=\"/records/{key}\"]"
        )))
        .await
        .expect("the escalated record is listed")
        .click()
        .await
        .unwrap();
    // A click that navigates returns before the next page is there: every look waits for
    // its element to appear.
    let text = |css: &'static str| {
        let browser = &browser;
        async move {
            browser
                .wait()
                .for_element(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("{css}: {e}"))
                .text()
                .await
                .unwrap()
        }
    };
    assert_eq!(text("#state").await, "escalated");
    assert_eq!(
        text("#reason-kind").await,
        EscalationDetail::of(&escalated).reason_kind.to_string()
    );
    assert!(text("#attempts")
        .await
        .contains("gateway timeout after sending"));
    assert!(
        text("#args").await.contains("o-browser <b>bold</b>"),
        "markup in the arguments is shown as text"
    );
    assert!(browser
        .find_all(Locator::Css("#args b"))
        .await
        .unwrap()
        .is_empty());

    screenshot(&browser, "console-escalated.png").await;

    // Resolved as completed: the form, then the confirmation page.
    let form = browser
        .wait()
        .for_element(Locator::Css("#decide-completed"))
        .await
        .unwrap();
    let field = |name: &'static str| {
        let form = &form;
        async move {
            form.find(Locator::Css(&format!("[name=\"{name}\"]")))
                .await
                .unwrap()
        }
    };
    field("downstream_ref")
        .await
        .send_keys("msg_browser_1")
        .await
        .unwrap();
    field("output")
        .await
        .send_keys(r#"{"sent":"o-browser","id":"msg_browser_1"}"#)
        .await
        .unwrap();
    assert_eq!(
        field("operator")
            .await
            .prop("value")
            .await
            .unwrap()
            .as_deref(),
        Some("ops-browser"),
        "prefilled from --operator"
    );
    field("note")
        .await
        .send_keys("found in the outbox")
        .await
        .unwrap();
    form.find(Locator::Css("button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(text("#confirm-decision").await.starts_with("completed"));
    assert_eq!(text("#confirm-operator").await, "ops-browser");
    assert_eq!(
        target.store.get(&key).await.unwrap().unwrap(),
        escalated,
        "the confirmation page changes nothing"
    );
    browser
        .find(Locator::Css("#confirm button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    // The record page shows the decision and the operator.
    assert_eq!(text("#state").await, "completed");
    let url = browser.current_url().await.unwrap();
    assert_eq!(url.path(), format!("/records/{key}"));
    assert_eq!(text("#downstream-ref").await, "msg_browser_1");
    let reason = text("#reason").await;
    assert!(
        reason.contains("found in the outbox") && reason.contains("by ops-browser"),
        "{reason}"
    );
    screenshot(&browser, "console-record.png").await;
    browser.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&profile);

    // The store: settled; the next call replays the output, the handler not run again.
    let settled = target.store.get(&key).await.unwrap().unwrap();
    assert_eq!(settled.state, RecordState::Completed);
    let again = registry.call(call()).await;
    assert!(again.replayed() && again.is_completed());
    assert_eq!(
        again.output(),
        Some(&json!({"sent": "o-browser", "id": "msg_browser_1"}))
    );
    assert_eq!(sends.load(Ordering::SeqCst), 1, "the handler ran once");
    assert!(
        !console.log().contains("o-browser"),
        "no argument in the log: {}",
        console.log()
    );
}
