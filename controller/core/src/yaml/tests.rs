use serde::Deserialize;
use serde_json::json;

use super::*;

fn value(text: &str) -> Value {
    from_str(text).unwrap()
}

#[test]
fn yaml_1_2_scalars_as_before() {
    // YAML 1.1 booleans, leading zeros and underscores stay strings.
    assert_eq!(
        value("a: yes\nb: on\nc: 0755\nd: 1_000\ne: True\nf: 0o17\ng: 0x1F\nh: ~"),
        json!({"a": "yes", "b": "on", "c": "0755", "d": "1_000", "e": true, "f": 15, "g": 31, "h": null})
    );
    // `<<` is an ordinary key, not a merge.
    assert_eq!(value("<<: {a: 1}\nb: 2"), json!({"<<": {"a": 1}, "b": 2}));
}

#[test]
fn duplicate_keys_are_an_error_naming_the_key() {
    let e = from_str::<Value>("a: 1\nb:\n  c: 1\n  c: 2\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "duplicate key `c` in a mapping at line 4, column 3"
    );
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct S {
        port: Option<u16>,
    }
    let e = from_str::<S>("port: 1\nport: 2").unwrap_err();
    assert!(e.to_string().contains("`port`"), "{e}");
}

#[test]
fn syntax_errors_are_one_line_with_a_position() {
    let e = from_str::<Value>("a: [\n").unwrap_err().to_string();
    assert!(!e.contains('\n') && e.contains("line 1"), "{e}");
}

#[test]
fn documents_skip_empty_ones_and_stop_at_a_syntax_error() {
    let docs = documents("a: 1\n---\n---\nb: 2\n---\nc: [\n");
    assert_eq!(docs.len(), 3, "{docs:?}");
    assert_eq!(docs[0].as_ref().unwrap(), &json!({"a": 1}));
    assert_eq!(docs[1].as_ref().unwrap(), &json!({"b": 2}));
    assert!(docs[2].is_err());
    // Manifests keep the last of a repeated key; our own files refuse it.
    let twice = "kind: A\nkind: B\n";
    assert_eq!(manifests(twice)[0].as_ref().unwrap(), &json!({"kind": "B"}));
    assert!(documents(twice)[0].is_err());
}

#[test]
fn writes_the_libyaml_layout() {
    let v = json!({
        "list": ["a", "b"],
        "empty": "",
        "colon": "x: y",
        "multi": "one\ntwo",
        "long": "word ".repeat(40).trim_end(),
        "num": "5",
        "bool": "true",
        "word": "yes",
        "ip": "10.1.0.1",
    });
    let want = format!(
        "bool: 'true'\ncolon: 'x: y'\nempty: ''\nip: 10.1.0.1\nlist:\n- a\n- b\nlong: {}\nmulti: |-\n  one\n  two\nnum: '5'\nword: yes\n",
        "word ".repeat(40).trim_end()
    );
    assert_eq!(to_string(&v).unwrap(), want);
    assert_eq!(value(&want), v);
}

#[test]
fn keeps_the_field_order_and_quotes_keys_like_values() {
    #[derive(Serialize)]
    struct S {
        zeta: u8,
        alpha: BTreeMap<String, f64>,
    }
    let s = S {
        zeta: 1,
        alpha: BTreeMap::from([("80".to_string(), 0.5), ("http".to_string(), -2.0)]),
    };
    assert_eq!(
        to_string(&s).unwrap(),
        "zeta: 1\nalpha:\n  '80': 0.5\n  http: -2.0\n"
    );
}
