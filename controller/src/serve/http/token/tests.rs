use super::*;

/// A rewritten file is seen after [`RECHECK`]: the new token works, the
/// old one stops; an emptied or removed file keeps the last token.
#[test]
fn a_rewritten_file_replaces_the_token_and_a_broken_one_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("token");
    std::fs::write(&f, "old-token\n").unwrap();
    let t = ApiToken::from_file(&f).unwrap();
    assert!(t.matches("old-token") && !t.matches("new-token") && !t.matches(""));
    std::fs::write(&f, "new-token").unwrap();
    let age = |t: &ApiToken| {
        t.cached.lock().unwrap().read_at = Instant::now() - RECHECK;
    };
    age(&t);
    assert!(t.matches("new-token"));
    assert!(!t.matches("old-token"));
    for broken in [Some(""), Some(" \n"), None] {
        match broken {
            Some(text) => std::fs::write(&f, text).unwrap(),
            None => std::fs::remove_file(&f).unwrap(),
        }
        age(&t);
        assert!(t.matches("new-token"), "{broken:?}");
        assert!(!t.matches(""), "{broken:?}");
    }
}

#[test]
fn start_up_errors_name_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("token");
    let e = ApiToken::from_file(&f).unwrap_err().to_string();
    assert!(
        e.starts_with("kube_discovery.http.auth_token_file: cannot read"),
        "{e}"
    );
    std::fs::write(&f, "\n").unwrap();
    let e = ApiToken::from_file(&f).unwrap_err().to_string();
    assert!(e.ends_with("is empty"), "{e}");
}
