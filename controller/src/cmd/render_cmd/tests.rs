use super::*;

#[test]
fn parses_multi_document_yaml_and_json() {
    let docs = parse_documents("a: 1\n---\n---\n{\"b\": 2}\n").unwrap();
    assert_eq!(docs, vec![json!({"a": 1}), json!({"b": 2})]);
    let e = parse_documents("a: 1\n---\nb: [\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("document #2"), "{e}");
}
