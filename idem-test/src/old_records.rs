//! What an upgrade test writes in an earlier layout (one record in each shape the earlier
//! code wrote: completed with evidence and arguments, running, unknown), and what the
//! current code must make of it once upgraded. Each backend's test writes the rows with its
//! own SQL; the records, and the checks on them, are the same for every backend.

use std::time::Duration;

use idem::identity::CanonicalJson;
use idem::identity::Fingerprint;
use idem::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem::store::conformance;
use idem::store::RecordState;
use idem::store::{AttemptKind, AttemptRecord, ClaimToken, Operation, ReadBackRecord, Timestamp};
use idem::{IdemKey, IdemStore, OutcomeClass, Scope};

/// One record as an earlier version stored it: the columns the rows differ in.
pub struct OldRow<'a> {
    /// The record's key.
    pub key: &'a IdemKey,
    /// The state column as the earlier code wrote it.
    pub state: &'a str,
    /// The claim token.
    pub token: ClaimToken,
    /// The lease end (ms), for a running record.
    pub lease_until: Option<i64>,
    /// The saved result (JSON text).
    pub payload: Option<&'a str>,
    /// The saved error message.
    pub message: Option<&'a str>,
    /// The downstream's reference for the effect.
    pub downstream_ref: Option<&'a str>,
    /// The attempts column (JSON text).
    pub attempts: &'a str,
    /// The read-backs column (JSON text).
    pub read_backs: &'a str,
}

/// Milliseconds as the SQL layouts store them.
pub fn ms(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).expect("a time in range")
}

/// The three records, claimed at `t0` and last written 100 ms later.
pub struct OldRecords {
    /// When the records were claimed.
    pub t0: Timestamp,
    /// The running record's lease end (ms).
    pub lease: i64,
    /// The arguments' fingerprint every record carries.
    pub fingerprint: Fingerprint,
    /// The operation the records carry.
    pub operation: Operation,
    /// The attempts of the completed and unknown records.
    pub attempts: Vec<AttemptRecord>,
    /// The read-backs of the completed record.
    pub read_backs: Vec<ReadBackRecord>,
    /// The completed record's key.
    pub done: IdemKey,
    /// The running record's key.
    pub running: IdemKey,
    /// The unknown record's key.
    pub unknown: IdemKey,
    /// The completed record's token.
    pub done_token: ClaimToken,
    /// The running record's token (its holder settles it after the upgrade).
    pub running_token: ClaimToken,
    /// The unknown record's token.
    pub unknown_token: ClaimToken,
    /// The operation as the JSON column holds it.
    pub operation_json: String,
    /// The attempts as the JSON column holds them.
    pub attempts_json: String,
    /// The read-backs as the JSON column holds them.
    pub read_backs_json: String,
}

impl OldRecords {
    /// The records, as of `now` (claimed 5 s before it; the running lease ends a minute
    /// after it).
    pub fn new(now: Timestamp) -> OldRecords {
        let t0 = Timestamp(now.as_millis() - 5_000);
        let operation = Operation {
            scope: Scope::run("upgrade-run"),
            intent: Some("order-7".into()),
            args: CanonicalJson::from_value(&serde_json::json!({"amount": 4900, "to": "acct_1"})),
        };
        let attempts = vec![AttemptRecord::new(
            1,
            t0,
            Timestamp(t0.as_millis() + 40),
            AttemptKind::Returned,
            OutcomeClass::Completed,
            Some("charged".into()),
        )];
        let read_backs = vec![ReadBackRecord {
            at: Timestamp(t0.as_millis() + 50),
            result: "found completed ch_1".into(),
        }];
        OldRecords {
            t0,
            lease: ms(now) + 60_000,
            fingerprint: conformance::fingerprint("args"),
            operation_json: serde_json::to_string(&operation).unwrap(),
            attempts_json: serde_json::to_string(&attempts).unwrap(),
            read_backs_json: serde_json::to_string(&read_backs).unwrap(),
            operation,
            attempts,
            read_backs,
            done: conformance::key("upgrade-done"),
            running: conformance::key("upgrade-running"),
            unknown: conformance::key("upgrade-unknown"),
            done_token: ClaimToken::fresh(),
            running_token: ClaimToken::fresh(),
            unknown_token: ClaimToken::fresh(),
        }
    }

    /// The rows to write in the old layout, one per record.
    pub fn rows(&self) -> [OldRow<'_>; 3] {
        [
            OldRow {
                key: &self.done,
                state: "completed",
                token: self.done_token,
                lease_until: None,
                payload: Some(r#"{"charged":4900}"#),
                message: None,
                downstream_ref: Some("ch_1"),
                attempts: &self.attempts_json,
                read_backs: &self.read_backs_json,
            },
            OldRow {
                key: &self.running,
                state: "running",
                token: self.running_token,
                lease_until: Some(self.lease),
                payload: None,
                message: None,
                downstream_ref: None,
                attempts: "[]",
                read_backs: "[]",
            },
            OldRow {
                key: &self.unknown,
                state: "unknown",
                token: self.unknown_token,
                lease_until: None,
                payload: None,
                message: Some("timed out after 30s"),
                downstream_ref: None,
                attempts: &self.attempts_json,
                read_backs: "[]",
            },
        ]
    }

    /// After the upgrade, through `store`: every record reads back field for field; the
    /// running claim's holder settles it through `other` (a second upgraded handle); a
    /// repeat of the completed call replays its saved result; the unknown record is listed.
    pub async fn check_upgraded<S: IdemStore>(&self, store: &S, other: &S) {
        let got = store
            .get(&self.done)
            .await
            .unwrap()
            .expect("the completed record");
        assert_eq!(got.state, RecordState::Completed);
        assert_eq!(got.fingerprint, self.fingerprint);
        assert_eq!(&*got.tool, "charge");
        assert_eq!(got.token, self.done_token);
        assert_eq!(got.lease_until, None);
        assert_eq!(
            (got.created_at, got.updated_at),
            (self.t0, Timestamp(self.t0.as_millis() + 100))
        );
        assert_eq!(got.payload, Some(serde_json::json!({"charged": 4900})));
        assert_eq!(got.downstream_ref.as_deref(), Some("ch_1"));
        assert_eq!(got.attempts, self.attempts);
        assert_eq!(got.read_backs, self.read_backs);
        assert_eq!(got.operation.as_ref(), Some(&self.operation));
        assert!(!got.result_expired);

        let got = store
            .get(&self.unknown)
            .await
            .unwrap()
            .expect("the unknown record");
        assert_eq!(got.state, RecordState::Unknown);
        assert_eq!(got.token, self.unknown_token);
        assert_eq!(got.message.as_deref(), Some("timed out after 30s"));
        assert_eq!(got.attempts, self.attempts);

        // The running claim's holder settles it through the new statements.
        let got = store
            .get(&self.running)
            .await
            .unwrap()
            .expect("the running record");
        assert_eq!(
            (got.state, got.lease_until),
            (RecordState::Running, Some(Timestamp(self.lease as u64)))
        );
        let mut settlement = Settlement::new(RecordState::Completed);
        settlement.payload = Some(serde_json::json!({"charged": 100}));
        other
            .settle(&self.running, self.running_token, settlement)
            .await
            .unwrap();
        let got = store
            .get(&self.running)
            .await
            .unwrap()
            .expect("the settled record");
        assert_eq!(got.state, RecordState::Completed);
        assert_eq!(got.payload, Some(serde_json::json!({"charged": 100})));

        // A repeat of the completed call replays its saved result.
        let repeat = ClaimRequest {
            key: self.done.clone(),
            fingerprint: self.fingerprint,
            tool: "charge".into(),
            lease: Duration::from_secs(30),
            operation: None,
        };
        match store.claim(&repeat).await.unwrap() {
            ClaimOutcome::Existing(r) => {
                assert_eq!(r.payload, Some(serde_json::json!({"charged": 4900})));
            }
            other => panic!("a settled key must replay, got {other:?}"),
        }
        let listed: Vec<IdemKey> = store
            .list(RecordState::Unknown, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.key)
            .collect();
        assert_eq!(listed, std::slice::from_ref(&self.unknown));
    }
}
