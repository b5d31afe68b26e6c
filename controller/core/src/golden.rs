//! Golden files of the planners' scripted tests: `testdata/<dir>/<scenario>.txt`,
//! compared with what a script printed; `UPDATE_GOLDEN=1` rewrites them.

use std::path::PathBuf;

/// Compares `out` with the golden file, or rewrites it under `UPDATE_GOLDEN`.
pub(crate) fn check(dir: &str, scenario: &str, out: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(dir)
        .join(format!("{scenario}.txt"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        std::fs::write(&path, out).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(
        out,
        want,
        "{scenario}: the plan changed (UPDATE_GOLDEN=1 rewrites {})",
        path.display()
    );
}

/// Compares `out` with a golden file that records an earlier behaviour
/// (`testdata/<dir>/<scenario>.txt`): never rewritten, not even under
/// `UPDATE_GOLDEN`.
pub(crate) fn check_fixed(dir: &str, scenario: &str, out: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(dir)
        .join(format!("{scenario}.txt"));
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        out,
        want,
        "{scenario}: the plan differs from the recorded one in {} (a record of \
         earlier behaviour: fix the code, not the file)",
        path.display()
    );
}
