use super::*;

#[test]
fn labels_exit_codes_and_texts_by_kind() {
    let setting: Error = SettingError::EmptyFile {
        setting: "kube_discovery.http.auth_token_file",
        path: "/run/token".into(),
    }
    .into();
    assert_eq!(
        setting.to_string(),
        "kube_discovery.http.auth_token_file: /run/token is empty"
    );
    assert_eq!(setting.metric_label(), "config");
    assert!(setting.is_usage());
    let input: Error = InputError::UnknownCluster("eu1".into()).into();
    assert_eq!(
        input.to_string(),
        "--nodes: cluster id \"eu1\" is not in the configuration"
    );
    assert_eq!(input.metric_label(), "input");
    assert!(input.is_usage());
    let http: Error = HttpError::CrdNotServed.into();
    assert_eq!(
        http.to_string(),
        "HTTP server: the DiscoveredService CRD was not served in time"
    );
    assert_eq!(http.metric_label(), "http");
    assert!(!http.is_usage());
    let none = Error::NoNodes {
        query: "default/web:http".into(),
        reason: "no such service and port",
    };
    assert_eq!(
        none.to_string(),
        "no nodes for default/web:http: no such service and port"
    );
    assert_eq!(none.metric_label(), "not_found");
    assert!(!none.is_usage());
}
