//! Defaults and validation of `v1` Endpoints and `discovery.k8s.io/v1`
//! EndpointSlices, as the real API server's `ValidateEndpoints*`
//! (`pkg/apis/core/validation`) and `ValidateEndpointSlice*`
//! (`pkg/apis/discovery/validation`), with their error texts and field paths.
//!
//! Addresses are parsed like Go's `netutils.ParseIPSloppy` (the pre-1.17
//! `net.ParseIP`: IPv4 octets may have leading zeros, IPv6 hex groups any
//! number of digits). An endpoint address may not be unspecified (`0.0.0.0`,
//! `::`), loopback (`127.0.0.0/8`, `::1`), link-local (`169.254.0.0/16`,
//! `fe80::/10`) or link-local multicast (`224.0.0.0/24`, `ff02::/16`);
//! EndpointSlices also need the family of their `addressType` (and IPv6 ones
//! the canonical form). As the real server, an update that leaves the
//! addresses as they were is not refused for them (older servers accepted
//! what is stored).

use serde_json::{Value, json};

use crate::field::{FieldError, FieldErrorKind};
use crate::names;

/// A parsed IP: 16 bytes, IPv4 in the IPv4-mapped form (as Go's `net.IP`).
type Ip = [u8; 16];

fn dtoi(s: &[u8]) -> Option<(u32, usize)> {
    let mut n: u32 = 0;
    let mut i = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        n = n * 10 + u32::from(s[i] - b'0');
        if n >= 0xFF_FFFF {
            return None;
        }
        i += 1;
    }
    (i > 0).then_some((n, i))
}

fn xtoi(s: &[u8]) -> Option<(u32, usize)> {
    let mut n: u32 = 0;
    let mut i = 0;
    while i < s.len() {
        let d = match s[i] {
            c @ b'0'..=b'9' => c - b'0',
            c @ b'a'..=b'f' => c - b'a' + 10,
            c @ b'A'..=b'F' => c - b'A' + 10,
            _ => break,
        };
        n = n * 16 + u32::from(d);
        if n >= 0xFF_FFFF {
            return None;
        }
        i += 1;
    }
    (i > 0).then_some((n, i))
}

fn parse_ipv4(s: &[u8]) -> Option<Ip> {
    let mut ip = [0u8; 16];
    ip[10] = 0xff;
    ip[11] = 0xff;
    let mut s = s;
    for i in 0..4 {
        if s.is_empty() {
            return None;
        }
        if i > 0 {
            if s[0] != b'.' {
                return None;
            }
            s = &s[1..];
        }
        let (n, c) = dtoi(s)?;
        if n > 0xFF {
            return None;
        }
        s = &s[c..];
        ip[12 + i] = n as u8;
    }
    s.is_empty().then_some(ip)
}

fn parse_ipv6(s: &[u8]) -> Option<Ip> {
    let mut ip = [0u8; 16];
    let mut ellipsis: Option<usize> = None;
    let mut s = s;
    if s.len() >= 2 && s[0] == b':' && s[1] == b':' {
        ellipsis = Some(0);
        s = &s[2..];
        if s.is_empty() {
            return Some(ip);
        }
    }
    let mut i = 0;
    while i < 16 {
        let (n, c) = xtoi(s)?;
        if n > 0xFFFF {
            return None;
        }
        if c < s.len() && s[c] == b'.' {
            if ellipsis.is_none() && i != 12 {
                return None;
            }
            if i + 4 > 16 {
                return None;
            }
            let ip4 = parse_ipv4(s)?;
            ip[i..i + 4].copy_from_slice(&ip4[12..16]);
            s = &[];
            i += 4;
            break;
        }
        ip[i] = (n >> 8) as u8;
        ip[i + 1] = n as u8;
        i += 2;
        s = &s[c..];
        if s.is_empty() {
            break;
        }
        if s[0] != b':' || s.len() == 1 {
            return None;
        }
        s = &s[1..];
        if s[0] == b':' {
            if ellipsis.is_some() {
                return None;
            }
            ellipsis = Some(i);
            s = &s[1..];
            if s.is_empty() {
                break;
            }
        }
    }
    if !s.is_empty() {
        return None;
    }
    if i < 16 {
        let e = ellipsis?;
        let n = 16 - i;
        for j in (e..i).rev() {
            ip[j + n] = ip[j];
        }
        for b in ip.iter_mut().skip(e).take(n) {
            *b = 0;
        }
    } else if ellipsis.is_some() {
        return None;
    }
    Some(ip)
}

/// `netutils.ParseIPSloppy`.
pub fn parse_ip_sloppy(s: &str) -> Option<Ip> {
    for b in s.bytes() {
        match b {
            b'.' => return parse_ipv4(s.as_bytes()),
            b':' => return parse_ipv6(s.as_bytes()),
            _ => {}
        }
    }
    None
}

fn to4(ip: &Ip) -> Option<[u8; 4]> {
    (ip[..10].iter().all(|b| *b == 0) && ip[10] == 0xff && ip[11] == 0xff)
        .then(|| [ip[12], ip[13], ip[14], ip[15]])
}

fn is_unspecified(ip: &Ip) -> bool {
    to4(ip).map_or(ip.iter().all(|b| *b == 0), |v4| v4 == [0; 4])
}

fn is_loopback(ip: &Ip) -> bool {
    match to4(ip) {
        Some(v4) => v4[0] == 127,
        None => ip[..15].iter().all(|b| *b == 0) && ip[15] == 1,
    }
}

fn is_link_local_unicast(ip: &Ip) -> bool {
    match to4(ip) {
        Some(v4) => v4[0] == 169 && v4[1] == 254,
        None => ip[0] == 0xfe && ip[1] & 0xc0 == 0x80,
    }
}

fn is_link_local_multicast(ip: &Ip) -> bool {
    match to4(ip) {
        Some(v4) => v4[0] == 224 && v4[1] == 0 && v4[2] == 0,
        None => ip[0] == 0xff && ip[1] & 0x0f == 0x02,
    }
}

/// Go's `net.IP.String()`.
fn ip_string(ip: &Ip) -> String {
    if let Some(v4) = to4(ip) {
        return std::net::Ipv4Addr::from(v4).to_string();
    }
    let groups: Vec<u16> = ip
        .chunks(2)
        .map(|c| u16::from(c[0]) << 8 | u16::from(c[1]))
        .collect();
    // The longest run of at least two zero groups (the first of equals).
    let (mut best, mut best_len) = (usize::MAX, 0);
    let mut i = 0;
    while i < 8 {
        let mut j = i;
        while j < 8 && groups[j] == 0 {
            j += 1;
        }
        if j - i >= 2 && j - i > best_len {
            best = i;
            best_len = j - i;
        }
        i = j.max(i + 1);
    }
    let mut out = String::new();
    let mut i = 0;
    while i < 8 {
        if i == best {
            out.push_str("::");
            i += best_len;
            continue;
        }
        if i > 0 && !out.ends_with(':') {
            out.push(':');
        }
        out.push_str(&format!("{:x}", groups[i]));
        i += 1;
    }
    out
}

fn invalid(field: &str, value: &str, detail: &str) -> FieldError {
    FieldError::new(
        field,
        FieldErrorKind::Invalid,
        format!("Invalid value: {value:?}: {detail}"),
    )
}

fn invalid_number(field: &str, value: i64, detail: &str) -> FieldError {
    FieldError::new(
        field,
        FieldErrorKind::Invalid,
        format!("Invalid value: {value}: {detail}"),
    )
}

fn required(field: &str, detail: &str) -> FieldError {
    let d = if detail.is_empty() {
        "Required value".to_string()
    } else {
        format!("Required value: {detail}")
    };
    FieldError::new(field, FieldErrorKind::Required, d)
}

/// One error per message of a `names` check (its messages are `; `-joined).
fn each(field: &str, value: &str, r: Result<(), String>, out: &mut Vec<FieldError>) {
    if let Err(msgs) = r {
        for m in msgs.split("; ") {
            out.push(invalid(field, value, m));
        }
    }
}

const VALID_IP: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";

/// `ValidateEndpointIP`: the address kinds no endpoint may have.
fn endpoint_ip(field: &str, s: &str, out: &mut Vec<FieldError>) {
    let Some(ip) = parse_ip_sloppy(s) else {
        out.push(invalid(field, s, "must be a valid IP address"));
        return;
    };
    if is_unspecified(&ip) {
        out.push(invalid(field, s, &format!("may not be unspecified ({s})")));
    }
    if is_loopback(&ip) {
        out.push(invalid(
            field,
            s,
            "may not be in the loopback range (127.0.0.0/8, ::1/128)",
        ));
    }
    if is_link_local_unicast(&ip) {
        out.push(invalid(
            field,
            s,
            "may not be in the link-local range (169.254.0.0/16, fe80::/10)",
        ));
    }
    if is_link_local_multicast(&ip) {
        out.push(invalid(
            field,
            s,
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)",
        ));
    }
}

/// `validation.IsValidIP` (strict: no leading zeros, no IPv4-mapped IPv6,
/// canonical form).
fn strict_ip(field: &str, s: &str, out: &mut Vec<FieldError>) -> bool {
    let Some(ip) = parse_ip_sloppy(s) else {
        out.push(invalid(field, s, VALID_IP));
        return false;
    };
    let mut errs = Vec::new();
    let parsed = s.parse::<std::net::IpAddr>();
    if parsed.is_err() {
        errs.push(invalid(field, s, "must not have leading 0s"));
    }
    if let Ok(std::net::IpAddr::V6(v6)) = parsed
        && v6.to_ipv4_mapped().is_some()
    {
        errs.push(invalid(field, s, "must not be an IPv4-mapped IPv6 address"));
    }
    if errs.is_empty() && ip_string(&ip) != s {
        errs.push(invalid(
            field,
            s,
            &format!("must be in canonical form ({:?})", ip_string(&ip)),
        ));
    }
    let ok = errs.is_empty();
    out.extend(errs);
    ok
}

const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];

fn protocol(field: &str, p: Option<&Value>, out: &mut Vec<FieldError>) {
    match p.and_then(Value::as_str) {
        None | Some("") => out.push(required(field, "")),
        Some(p) if PROTOCOLS.contains(&p) => {}
        Some(p) => out.push(FieldError::new(
            field,
            FieldErrorKind::NotSupported,
            format!("Unsupported value: {p:?}: supported values: \"SCTP\", \"TCP\", \"UDP\""),
        )),
    }
}

fn str_of<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

fn array<'a>(v: &'a Value, k: &str) -> &'a [Value] {
    v.get(k)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// `SetDefaults_Endpoints`: a port without a protocol is TCP.
pub fn default_endpoints(obj: &mut Value) {
    if let Some(subsets) = obj.get_mut("subsets").and_then(Value::as_array_mut) {
        for ss in subsets {
            if let Some(ports) = ss.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports.iter_mut().filter(|p| p.is_object()) {
                    if p.get("protocol").is_none_or(Value::is_null) {
                        p["protocol"] = json!("TCP");
                    }
                }
            }
        }
    }
}

/// `ValidateEndpointsCreate` / `ValidateEndpointsUpdate` (`old`) of the
/// subsets (object metadata is checked by the caller).
pub fn validate_endpoints(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut out = Vec::new();
    for (i, ss) in array(obj, "subsets").iter().enumerate() {
        let at = format!("subsets[{i}]");
        let (ready, not_ready) = (array(ss, "addresses"), array(ss, "notReadyAddresses"));
        if ready.is_empty() && not_ready.is_empty() {
            out.push(required(
                &at,
                "must specify `addresses` or `notReadyAddresses`",
            ));
        }
        for (list, addrs) in [("addresses", ready), ("notReadyAddresses", not_ready)] {
            for (j, a) in addrs.iter().enumerate() {
                let at = format!("{at}.{list}[{j}]");
                let ip = str_of(a, "ip").unwrap_or("");
                let ip_field = format!("{at}.ip");
                if parse_ip_sloppy(ip).is_none() {
                    out.push(invalid(&ip_field, ip, VALID_IP));
                }
                if let Some(h) = str_of(a, "hostname").filter(|h| !h.is_empty()) {
                    each(
                        &format!("{at}.hostname"),
                        h,
                        names::validate_dns1123_label(h),
                        &mut out,
                    );
                }
                if let Some(n) = str_of(a, "nodeName") {
                    each(
                        &format!("{at}.nodeName"),
                        n,
                        names::validate_dns1123_subdomain(n),
                        &mut out,
                    );
                }
                endpoint_ip(&ip_field, ip, &mut out);
            }
        }
        let ports = array(ss, "ports");
        for (j, p) in ports.iter().enumerate() {
            let at = format!("{at}.ports[{j}]");
            let name = str_of(p, "name").unwrap_or("");
            if ports.len() > 1 && name.is_empty() {
                out.push(required(&format!("{at}.name"), ""));
            } else if !name.is_empty() {
                each(
                    &format!("{at}.name"),
                    name,
                    names::validate_dns1123_label(name),
                    &mut out,
                );
            }
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            if !(1..=65535).contains(&port) {
                out.push(invalid_number(
                    &format!("{at}.port"),
                    port,
                    "must be between 1 and 65535, inclusive",
                ));
            }
            protocol(&format!("{at}.protocol"), p.get("protocol"), &mut out);
            if let Some(ap) = str_of(p, "appProtocol") {
                each(
                    &format!("{at}.appProtocol"),
                    ap,
                    names::validate_qualified_name(ap),
                    &mut out,
                );
            }
        }
    }
    if !out.is_empty() && old.is_some_and(|o| o.get("subsets") == obj.get("subsets")) {
        out.clear();
    }
    out
}

/// `SetDefaults_EndpointPort` of discovery/v1: a port without a name has the
/// empty name, without a protocol TCP.
pub fn default_endpoint_slice(obj: &mut Value) {
    if let Some(ports) = obj.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter(|p| p.is_object()) {
            if p.get("name").is_none_or(Value::is_null) {
                p["name"] = json!("");
            }
            if p.get("protocol").is_none_or(Value::is_null) {
                p["protocol"] = json!("TCP");
            }
        }
    }
}

/// `ValidateEndpointSliceCreate` / `ValidateEndpointSliceUpdate` (`old`)
/// without the object metadata (checked by the caller).
pub fn validate_endpoint_slice(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut out = Vec::new();
    let address_type = str_of(obj, "addressType").unwrap_or("");
    match address_type {
        "" => out.push(required("addressType", "")),
        "IPv4" | "IPv6" | "FQDN" => {}
        other => out.push(FieldError::new(
            "addressType",
            FieldErrorKind::NotSupported,
            format!("Unsupported value: {other:?}: supported values: \"FQDN\", \"IPv4\", \"IPv6\""),
        )),
    }
    let ports = array(obj, "ports");
    if ports.len() > 20000 {
        out.push(too_many("ports", ports.len(), 20000));
    } else {
        let mut seen: Vec<&str> = Vec::new();
        for (i, p) in ports.iter().enumerate() {
            let at = format!("ports[{i}]");
            let name = str_of(p, "name").unwrap_or("");
            if !name.is_empty() {
                each(
                    &format!("{at}.name"),
                    name,
                    names::validate_dns1123_label(name),
                    &mut out,
                );
            }
            if seen.contains(&name) {
                out.push(FieldError::new(
                    format!("{at}.name"),
                    FieldErrorKind::Duplicate,
                    format!("Duplicate value: {name:?}"),
                ));
            } else {
                seen.push(name);
            }
            protocol(&format!("{at}.protocol"), p.get("protocol"), &mut out);
            if let Some(ap) = str_of(p, "appProtocol") {
                each(
                    &format!("{at}.appProtocol"),
                    ap,
                    names::validate_qualified_name(ap),
                    &mut out,
                );
            }
        }
    }
    let endpoints = slice_endpoints(obj, address_type);
    let unchanged = old.is_some_and(|o| o.get("endpoints") == obj.get("endpoints"));
    if !unchanged {
        out.extend(endpoints);
    }
    if let Some(old) = old {
        let before = str_of(old, "addressType").unwrap_or("");
        if before != address_type {
            out.push(invalid("addressType", address_type, "field is immutable"));
        }
    }
    out
}

fn too_many(field: &str, n: usize, max: usize) -> FieldError {
    FieldError::new(
        field,
        FieldErrorKind::TooMany,
        format!("Too many: {n}: must have at most {max} items"),
    )
}

fn slice_endpoints(obj: &Value, address_type: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    let endpoints = array(obj, "endpoints");
    if endpoints.len() > 1000 {
        out.push(too_many("endpoints", endpoints.len(), 1000));
        return out;
    }
    for (i, ep) in endpoints.iter().enumerate() {
        let at = format!("endpoints[{i}]");
        let addresses_at = format!("{at}.addresses");
        let addresses = array(ep, "addresses");
        if addresses.is_empty() {
            out.push(required(&addresses_at, "must contain at least 1 address"));
        } else if addresses.len() > 100 {
            out.push(too_many(&addresses_at, addresses.len(), 100));
        }
        for (j, a) in addresses.iter().enumerate() {
            let a = a.as_str().unwrap_or("");
            let indexed = format!("{addresses_at}[{j}]");
            match address_type {
                "IPv4" => match parse_ip_sloppy(a) {
                    None => out.push(invalid(&indexed, a, VALID_IP)),
                    Some(ip) => {
                        if to4(&ip).is_none() {
                            out.push(invalid(&addresses_at, a, "must be an IPv4 address"));
                        }
                        endpoint_ip(&indexed, a, &mut out);
                    }
                },
                "IPv6" if strict_ip(&indexed, a, &mut out) => {
                    if parse_ip_sloppy(a).and_then(|ip| to4(&ip)).is_some() {
                        out.push(invalid(&addresses_at, a, "must be an IPv6 address"));
                    }
                    endpoint_ip(&indexed, a, &mut out);
                }
                "FQDN" => fqdn(&indexed, a, &mut out),
                _ => {}
            }
        }
        if let Some(n) = str_of(ep, "nodeName") {
            each(
                &format!("{at}.nodeName"),
                n,
                names::validate_dns1123_subdomain(n),
                &mut out,
            );
        }
        if let Some(h) = str_of(ep, "hostname") {
            each(
                &format!("{at}.hostname"),
                h,
                names::validate_dns1123_label(h),
                &mut out,
            );
        }
    }
    out
}

/// `validation.IsFullyQualifiedDomainName`.
fn fqdn(field: &str, name: &str, out: &mut Vec<FieldError>) {
    if name.is_empty() {
        out.push(required(field, ""));
        return;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    if let Err(e) = names::validate_dns1123_subdomain(name) {
        out.push(invalid(field, name, &e.replace("; ", ",")));
        return;
    }
    if name.split('.').count() < 2 {
        out.push(invalid(
            field,
            name,
            "should be a domain with at least two segments separated by dots",
        ));
        return;
    }
    for label in name.split('.') {
        if let Err(e) = names::validate_dns1123_label(label) {
            out.push(invalid(field, label, &e.replace("; ", ",")));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(|e| e.message.clone()).collect()
    }

    #[test]
    fn sloppy_parsing_is_go_s() {
        for ok in [
            "10.0.0.1",
            "010.000.000.001",
            "::",
            "::1",
            "fd00::1",
            "FD00:0::2",
            "::ffff:10.0.0.1",
            "1:2:3:4:5:6:7:8",
            "00001::",
        ] {
            assert!(parse_ip_sloppy(ok).is_some(), "{ok}");
        }
        for bad in [
            "",
            "999.0.0.1",
            "not-an-ip",
            "1.2.3",
            "1.2.3.4.5",
            "1:2:3:4:5:6:7:8:9",
            "1::2::3",
            "fe80::1%eth0",
            "10.0.0.1:80",
        ] {
            assert!(parse_ip_sloppy(bad).is_none(), "{bad}");
        }
        let ip = parse_ip_sloppy("::ffff:127.0.0.1").expect("parses");
        assert!(is_loopback(&ip), "IPv4-mapped loopback");
        assert_eq!(
            ip_string(&parse_ip_sloppy("fd00:0::2").expect("ip")),
            "fd00::2"
        );
        assert_eq!(
            ip_string(&parse_ip_sloppy("1:0:0:1::1").expect("ip")),
            "1:0:0:1::1"
        );
        assert_eq!(
            ip_string(&parse_ip_sloppy("1:0:2::").expect("ip")),
            "1:0:2::"
        );
        assert_eq!(
            ip_string(&parse_ip_sloppy("::ffff:1.2.3.4").expect("ip")),
            "1.2.3.4"
        );
    }

    #[test]
    fn endpoints_addresses_and_ports_as_the_api_server() {
        let mut ep = json!({"subsets": [
            {"addresses": [{"ip": "10.0.0.5"}, {"ip": "999.0.0.1"}, {"ip": "127.0.0.1"},
                           {"ip": "0.0.0.0"}, {"ip": "169.254.1.1"}, {"ip": "224.0.0.5"},
                           {"ip": "ff02::1"}, {"ip": "010.0.0.1"}],
             "ports": [{"name": "zero", "port": 0}, {"name": "http", "port": 80},
                       {"name": "http", "port": 81}, {"port": 82, "protocol": "XYZ"}]},
            {"ports": [{"port": 1}]}]});
        default_endpoints(&mut ep);
        assert_eq!(ep["subsets"][0]["ports"][1]["protocol"], "TCP");
        assert_eq!(
            messages(&validate_endpoints(&ep, None)),
            [
                r#"subsets[0].addresses[1].ip: Invalid value: "999.0.0.1": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"#,
                r#"subsets[0].addresses[1].ip: Invalid value: "999.0.0.1": must be a valid IP address"#,
                r#"subsets[0].addresses[2].ip: Invalid value: "127.0.0.1": may not be in the loopback range (127.0.0.0/8, ::1/128)"#,
                r#"subsets[0].addresses[3].ip: Invalid value: "0.0.0.0": may not be unspecified (0.0.0.0)"#,
                r#"subsets[0].addresses[4].ip: Invalid value: "169.254.1.1": may not be in the link-local range (169.254.0.0/16, fe80::/10)"#,
                r#"subsets[0].addresses[5].ip: Invalid value: "224.0.0.5": may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"#,
                r#"subsets[0].addresses[6].ip: Invalid value: "ff02::1": may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"#,
                "subsets[0].ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
                "subsets[0].ports[3].name: Required value",
                r#"subsets[0].ports[3].protocol: Unsupported value: "XYZ": supported values: "SCTP", "TCP", "UDP""#,
                "subsets[1]: Required value: must specify `addresses` or `notReadyAddresses`",
            ]
        );
        // An update keeping the stored subsets is not refused for them.
        assert!(validate_endpoints(&ep, Some(&ep.clone())).is_empty());
    }

    #[test]
    fn slices_check_the_family_of_their_address_type() {
        let mut s = json!({"addressType": "IPv4",
            "endpoints": [{"addresses": ["fd00::1"]}, {"addresses": ["10.0.2.1", "127.0.0.1", "::ffff:10.0.0.1"]},
                          {"addresses": []}],
            "ports": [{"name": "http", "port": 8080}, {"name": "http", "port": 81}, {"port": 0}, {"port": 70000}]});
        default_endpoint_slice(&mut s);
        assert_eq!(
            messages(&validate_endpoint_slice(&s, None)),
            [
                r#"ports[1].name: Duplicate value: "http""#,
                r#"ports[3].name: Duplicate value: """#,
                r#"endpoints[0].addresses: Invalid value: "fd00::1": must be an IPv4 address"#,
                r#"endpoints[1].addresses[1]: Invalid value: "127.0.0.1": may not be in the loopback range (127.0.0.0/8, ::1/128)"#,
                "endpoints[2].addresses: Required value: must contain at least 1 address",
            ]
        );
        let v6 = json!({"addressType": "IPv6", "endpoints": [{"addresses":
            ["10.0.0.1", "FD00::1", "fd00::3", "::", "::ffff:10.0.0.1", "010.0.0.1"]}]});
        assert_eq!(
            messages(&validate_endpoint_slice(&v6, None)),
            [
                r#"endpoints[0].addresses: Invalid value: "10.0.0.1": must be an IPv6 address"#,
                r#"endpoints[0].addresses[1]: Invalid value: "FD00::1": must be in canonical form ("fd00::1")"#,
                r#"endpoints[0].addresses[3]: Invalid value: "::": may not be unspecified (::)"#,
                r#"endpoints[0].addresses[4]: Invalid value: "::ffff:10.0.0.1": must not be an IPv4-mapped IPv6 address"#,
                r#"endpoints[0].addresses[5]: Invalid value: "010.0.0.1": must not have leading 0s"#,
            ]
        );
        let mut changed = s.clone();
        changed["addressType"] = json!("IPv6");
        let errs = messages(&validate_endpoint_slice(&changed, Some(&s)));
        assert_eq!(
            errs.last().map(String::as_str),
            Some(r#"addressType: Invalid value: "IPv6": field is immutable"#)
        );
    }
}
