//! Claim tokens stay unique across `fork`: a child process starts with a copy of its
//! parent's memory, and must not mint the tokens its parent mints next.
#![cfg(unix)]

use std::io::{Read, Write};

use idem_runtime::store::ClaimToken;

#[test]
fn a_forked_child_mints_tokens_its_parent_does_not() {
    // The parent has minted before the fork, so whatever state tokens come from exists
    // (and is copied into the child).
    let before = ClaimToken::fresh();
    let (mut reader, mut writer) = std::io::pipe().expect("pipe");
    // SAFETY: the child only mints tokens, writes them to the pipe and leaves with `_exit`,
    // never returning into the test harness or touching its locks.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut out = String::new();
        for _ in 0..4 {
            out.push_str(&ClaimToken::fresh().to_hex());
        }
        let ok = writer.write_all(out.as_bytes()).is_ok();
        // SAFETY: ends the child at once, without running the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    drop(writer);
    let parent: Vec<ClaimToken> = (0..4).map(|_| ClaimToken::fresh()).collect();
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .expect("read the child's tokens");
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(text.len(), 4 * 32, "the child wrote {text:?}");
    let child: Vec<ClaimToken> = (0..4)
        .map(|i| ClaimToken::from_hex(&text[i * 32..(i + 1) * 32]).expect("hex token"))
        .collect();
    for t in &child {
        assert!(
            !parent.contains(t) && *t != before,
            "the child minted {t:?}, which the parent minted too: {parent:?}"
        );
    }
}
