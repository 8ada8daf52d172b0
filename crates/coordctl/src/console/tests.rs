//! Unit tests of the console's checks: which Host names and listen
//! addresses count as loopback, the bounds on `?limit=` and cursors, and
//! HTML escaping. The pages themselves are driven end to end by
//! `tests/console.rs`.

use super::guard::loopback_host;
use super::*;

#[test]
fn loopback_hosts() {
    for ok in [
        "127.0.0.1:8080",
        "127.0.0.1",
        "localhost:1",
        "LOCALHOST",
        "[::1]:8080",
        "[::1]",
        "127.1.2.3:9",
    ] {
        assert!(loopback_host(ok), "{ok}");
    }
    for bad in [
        "evil.example:8080",
        "10.0.0.1:8080",
        "localhost.evil.example",
        "[::2]:80",
        "",
        "127.0.0.1.nip.io:8080",
    ] {
        assert!(!loopback_host(bad), "{bad}");
    }
}

#[test]
fn addresses_other_than_loopback_need_allow_remote() {
    let lan: SocketAddr = "0.0.0.0:8080".parse().unwrap();
    let err = check_addr(lan, false).unwrap_err().to_string();
    assert!(err.contains("--allow-remote"), "{err}");
    assert!(check_addr(lan, true).is_ok());
    assert!(check_addr("127.0.0.1:0".parse().unwrap(), false).is_ok());
    assert!(check_addr("[::1]:0".parse().unwrap(), false).is_ok());
}

#[test]
fn limits_are_bounded() {
    assert_eq!(parse_limit(None, 7).unwrap(), 7);
    assert_eq!(parse_limit(Some("500"), 7).unwrap(), 500);
    for bad in ["0", "501", "-1", "ten", "99999999999999999999999"] {
        let f = parse_limit(Some(bad), 7).unwrap_err();
        assert_eq!(f.status, StatusCode::BAD_REQUEST);
        assert!(f.message.contains("1 to 500"), "{}", f.message);
    }
    assert!(parse_cursor(Some(&"x".repeat(MAX_TEXT + 1))).is_err());
    assert_eq!(parse_cursor(Some("")).unwrap(), None);
}

#[test]
fn escapes_markup() {
    assert_eq!(
        html::note(r#"<script>alert("x")</script>&"#),
        r#"<p class="note">&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;</p>"#
    );
    let page = html::confirm("k\"><b>", "applied", "<i>", "r", "now", "t");
    assert!(!page.contains("<b>\"") && !page.contains("<i>"), "{page}");
    assert!(page.contains(r#"value="k&quot;&gt;&lt;b&gt;""#), "{page}");
}
