//! Alibaba Cloud's request signature V3, `ACS3-HMAC-SHA256` (pure).
//!
//! Source: Alibaba Cloud SDK documentation, "Request syntax and signature method V3"
//! (`/help/en/sdk/product-overview/v3-request-structure-and-signature`). The V2 page (RPC
//! `HMAC-SHA1`, what cloud-api-adaptor's Go SDK still sends) says V2 is discontinued in favour of
//! V3, and V3 covers RPC-style APIs such as ECS and VPC: canonical URI `/`, parameters in the
//! query string, empty body.
//!
//! ```text
//! CanonicalRequest = Method \n CanonicalURI \n CanonicalQueryString \n CanonicalHeaders \n
//!                    SignedHeaders \n HexEncode(SHA256(body))
//! StringToSign     = "ACS3-HMAC-SHA256" \n HexEncode(SHA256(CanonicalRequest))
//! Signature        = HexEncode(HMAC-SHA256(AccessKeySecret, StringToSign))
//! Authorization    = ACS3-HMAC-SHA256 Credential=<AccessKeyId>,SignedHeaders=<...>,Signature=<...>
//! ```

use ring::{digest, hmac};

/// The algorithm name, first line of the string to sign and first word of `Authorization`.
pub const ALGORITHM: &str = "ACS3-HMAC-SHA256";

/// What one request signs. Header names must be lower case; `headers` holds `host` and every
/// `x-acs-*` header the request carries (they are all signed).
pub struct SigningInput<'a> {
    pub method: &'a str,
    pub query: &'a [(String, String)],
    pub headers: &'a [(&'a str, String)],
    pub payload_sha256: &'a str,
}

/// The parts of a signed request the caller needs, and the intermediate strings for tests.
#[derive(Debug, PartialEq, Eq)]
pub struct Signed {
    pub canonical_query: String,
    pub canonical_request: String,
    pub string_to_sign: String,
    pub authorization: String,
}

/// Signs `input` with the key pair (`secret` is only used as the HMAC key).
pub fn sign(input: &SigningInput<'_>, access_key_id: &str, secret: &str) -> Signed {
    let canonical_query = canonical_query(input.query);
    let mut headers: Vec<(String, String)> = input
        .headers
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    headers.sort();
    let canonical_headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}:{value}\n"))
        .collect();
    let signed_headers = headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_request = format!(
        "{}\n/\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{}",
        input.method, input.payload_sha256
    );
    let string_to_sign = format!("{ALGORITHM}\n{}", sha256_hex(canonical_request.as_bytes()));
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let signature = hex(hmac::sign(&key, string_to_sign.as_bytes()).as_ref());
    Signed {
        canonical_query,
        authorization: format!(
            "{ALGORITHM} Credential={access_key_id},SignedHeaders={signed_headers},Signature={signature}"
        ),
        canonical_request,
        string_to_sign,
    }
}

/// Parameters percent-encoded (RFC 3986: only `A-Za-z0-9-_.~` stay as they are) and sorted by
/// name, joined as `k=v&k=v`. The same string is the request's query string.
pub fn canonical_query(params: &[(String, String)]) -> String {
    let mut encoded: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (percent_encode(k), percent_encode(v)))
        .collect();
    encoded.sort();
    encoded
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, bytes).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of "Request syntax and signature method V3" (RunInstances on
    /// ecs.cn-shanghai.aliyuncs.com, key pair `YourAccessKeyId` / `YourAccessKeySecret`).
    #[test]
    fn matches_the_documented_example() {
        let query = vec![
            (
                "ImageId".to_owned(),
                "win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd".to_owned(),
            ),
            ("RegionId".to_owned(), "cn-shanghai".to_owned()),
        ];
        let empty = sha256_hex(b"");
        assert_eq!(
            empty,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let headers = [
            ("host", "ecs.cn-shanghai.aliyuncs.com".to_owned()),
            ("x-acs-action", "RunInstances".to_owned()),
            ("x-acs-version", "2014-05-26".to_owned()),
            ("x-acs-date", "2023-10-26T10:22:32Z".to_owned()),
            (
                "x-acs-signature-nonce",
                "3156853299f313e23d1673dc12e1703d".to_owned(),
            ),
            ("x-acs-content-sha256", empty.clone()),
        ];
        let signed = sign(
            &SigningInput {
                method: "POST",
                query: &query,
                headers: &headers,
                payload_sha256: &empty,
            },
            "YourAccessKeyId",
            "YourAccessKeySecret",
        );
        assert_eq!(
            signed.canonical_request,
            "POST\n/\nImageId=win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd&RegionId=cn-shanghai\n\
             host:ecs.cn-shanghai.aliyuncs.com\nx-acs-action:RunInstances\n\
             x-acs-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n\
             x-acs-date:2023-10-26T10:22:32Z\nx-acs-signature-nonce:3156853299f313e23d1673dc12e1703d\n\
             x-acs-version:2014-05-26\n\n\
             host;x-acs-action;x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            signed.string_to_sign,
            "ACS3-HMAC-SHA256\n7ea06492da5221eba5297e897ce16e55f964061054b7695beedaac1145b1e259"
        );
        assert_eq!(
            signed.authorization,
            "ACS3-HMAC-SHA256 Credential=YourAccessKeyId,SignedHeaders=host;x-acs-action;\
             x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version,\
             Signature=06563a9e1b43f5dfe96b81484da74bceab24a1d853912eee15083a6f0f3283c0"
        );
    }

    #[test]
    fn query_is_rfc3986_encoded_and_sorted() {
        let params = vec![
            ("Tag.1.Value".to_owned(), "a b*~/".to_owned()),
            ("InstanceIds".to_owned(), "[\"i-1\"]".to_owned()),
            ("Empty".to_owned(), String::new()),
        ];
        assert_eq!(
            canonical_query(&params),
            "Empty=&InstanceIds=%5B%22i-1%22%5D&Tag.1.Value=a%20b%2A~%2F"
        );
        assert_eq!(percent_encode("é"), "%C3%A9");
    }
}
