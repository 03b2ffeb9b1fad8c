//! The decisions: a form on the record page, a confirmation page that changes nothing, and
//! the confirmed POST, which runs the very check and resolve `idem resolve` runs
//! ([`Request::check`], [`Request::decide`]). Both POSTs need the CSRF token.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;

use idem_runtime::identity::IdemKey;

use super::pages::{self, message, not_a_key, render};
use super::server::Shared;
use crate::resolve::{Refusal, Request};

/// A decision form's fields (all optional here: a missing one is refused with a message).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct DecisionForm {
    csrf: String,
    /// `completed`, `failed` or `release`.
    decision: String,
    downstream_ref: String,
    output: String,
    reason: String,
    /// A release while a send may still land: how the operator knows it will not.
    force_reason: String,
    operator: String,
    note: String,
}

fn given(s: &str) -> Option<String> {
    (!s.trim().is_empty()).then(|| s.to_owned())
}

impl DecisionForm {
    /// The request `idem resolve` would make of the same answers, checked the same way.
    fn request(&self, key: &str) -> Result<Request, String> {
        if self.operator.trim().is_empty() {
            return Err("Say who decides: the operator's name is required.".into());
        }
        if self.note.trim().is_empty() {
            return Err("Say why in the note: it is kept with the decision.".into());
        }
        let (completed, output, failed, release) = match self.decision.as_str() {
            "completed" => (
                Some(self.downstream_ref.clone()),
                given(&self.output),
                None,
                (false, None),
            ),
            "failed" => (None, None, Some(self.reason.clone()), (false, None)),
            "release" => (None, None, None, (true, given(&self.force_reason))),
            _ => return Err("Choose a decision: completed, failed or release.".into()),
        };
        Request::check(
            key,
            completed,
            output.as_deref(),
            failed,
            release,
            &self.note,
            Some(self.operator.clone()),
        )
    }

    /// The decision in words, its fields, and what confirming does.
    #[allow(clippy::type_complexity)]
    fn described(&self) -> (&'static str, Vec<(&'static str, String)>, &'static str) {
        match self.decision.as_str() {
            "completed" => {
                let mut fields = vec![("Downstream ref", self.downstream_ref.trim().to_owned())];
                if let Some(o) = given(&self.output) {
                    fields.push(("Output", o));
                }
                (
                    "completed: the effect happened",
                    fields,
                    "The record is settled as completed for good: every repeat of the call \
                     replays this result, and the handler does not run again.",
                )
            }
            "failed" => (
                "failed: the effect did not happen and will not",
                vec![("Reason", self.reason.trim().to_owned())],
                "The record is settled as failed for good: every repeat of the call gets \
                 this failure.",
            ),
            _ => {
                let mut fields = Vec::new();
                if let Some(f) = given(&self.force_reason) {
                    fields.push(("Forced, because", f));
                }
                (
                    "release: the effect never happened",
                    fields,
                    "The key is freed: the next call with the same arguments runs the \
                     handler again. The store keeps a trace of the release.",
                )
            }
        }
    }
}

#[derive(Template)]
#[template(path = "confirm.html")]
struct ConfirmPage<'a> {
    key: &'a str,
    summary: &'a str,
    details: Vec<(&'static str, String)>,
    consequence: &'a str,
    form: &'a DecisionForm,
    csrf: &'a str,
}

fn forbidden() -> Response {
    message(
        StatusCode::FORBIDDEN,
        "Refused",
        "This decision did not carry the console's CSRF token (it was not sent from a page \
         of this console, or the console restarted since the page was loaded); nothing was \
         changed. Reload the record and decide again.",
        Some("/"),
    )
}

/// What both steps of a decision check first, in this order: the CSRF token, the key, the
/// answers (the CLI's own check). A refusal is the page to answer with; nothing is changed.
fn checked(console: &Shared, key: &str, form: &DecisionForm) -> Result<Request, Box<Response>> {
    if !console.auth.csrf_matches(&form.csrf) {
        return Err(Box::new(forbidden()));
    }
    if let Err(e) = IdemKey::parse(key) {
        return Err(Box::new(not_a_key(e)));
    }
    form.request(key).map_err(|e| {
        let back = format!("/records/{key}");
        Box::new(message(
            StatusCode::BAD_REQUEST,
            "Not decided",
            &e,
            Some(&back),
        ))
    })
}

/// `POST /records/{key}/confirm`: checks the answers and shows what confirming would do.
/// Changes nothing.
pub(crate) async fn confirm(
    State(console): State<Shared>,
    Path(key): Path<String>,
    Form(form): Form<DecisionForm>,
) -> Response {
    if let Err(refused) = checked(&console, &key, &form) {
        return *refused;
    }
    let (summary, details, consequence) = form.described();
    render(
        StatusCode::OK,
        &ConfirmPage {
            key: &key,
            summary,
            details,
            consequence,
            form: &form,
            csrf: console.auth.csrf(),
        },
    )
}

/// `POST /records/{key}/resolve`: the confirmed decision, applied as `idem resolve`
/// applies it; then back to the record, which shows it.
pub(crate) async fn resolve(
    State(console): State<Shared>,
    Path(key): Path<String>,
    Form(form): Form<DecisionForm>,
) -> Response {
    let request = match checked(&console, &key, &form) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let back = format!("/records/{key}");
    let registry = match console.registry().await {
        Ok(r) => r,
        Err(e) => return pages::unreachable(&e),
    };
    // The release evidence line `idem resolve` writes to stderr holds the arguments: the
    // console's log holds none, and the store keeps the release trace.
    match request.decide(&registry, |_| {}).await {
        Ok(_) => Redirect::to(&format!("/records/{}", request.key())).into_response(),
        Err(Refusal::MayStillLand(e)) => message(
            StatusCode::CONFLICT,
            "Release refused",
            &format!(
                "{e}. Nothing was changed. To release it anyway, fill in \"Force, because\" \
                 with how you know the send will not land."
            ),
            Some(&back),
        ),
        Err(Refusal::Other(e)) => message(
            StatusCode::CONFLICT,
            "Not decided",
            &format!("{e}. Nothing was changed."),
            Some(&back),
        ),
    }
}
