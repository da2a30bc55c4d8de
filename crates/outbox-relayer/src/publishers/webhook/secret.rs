//! Standard Webhooks signing keys and the `v1` signature
//! (<https://www.standardwebhooks.com/>): HMAC-SHA256 over `{webhook-id}.{webhook-timestamp}.{body}`,
//! base64 (standard alphabet, padded), prefixed `v1,`.

use base64::Engine as _;

/// Prefix of a secret given as base64 key bytes, as Standard Webhooks serialises secrets.
const WHSEC_PREFIX: &str = "whsec_";

/// Fewest key bytes accepted (the Standard Webhooks minimum: 192 bits).
const MIN_KEY_BYTES: usize = 24;

/// One HMAC-SHA256 key, decoded from its configured form.
#[derive(Clone)]
pub(crate) struct SigningKey(Vec<u8>);

impl SigningKey {
    /// `whsec_<base64>`: the decoded bytes; any other string: its UTF-8 bytes. The error says
    /// what is wrong without repeating the secret.
    pub(crate) fn parse(secret: &str) -> Result<Self, String> {
        let key = match secret.strip_prefix(WHSEC_PREFIX) {
            Some(encoded) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                // The decoder's message names an offending byte: part of the secret.
                .map_err(|_| format!("the part after `{WHSEC_PREFIX}` is not base64"))?,
            None => secret.as_bytes().to_vec(),
        };
        if key.len() < MIN_KEY_BYTES {
            return Err(format!(
                "the key is {} bytes, fewer than the {MIN_KEY_BYTES} Standard Webhooks requires",
                key.len()
            ));
        }
        Ok(Self(key))
    }

    /// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
    #[cfg(feature = "webhook")]
    pub(crate) fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        use hmac::Mac as _;
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        let tag = mac.finalize().into_bytes();
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(tag)
        )
    }
}

/// The `webhook-signature` value for `secrets`: one `v1,` signature per key, space-separated (the
/// Standard Webhooks form for secret rotation). The error says which secret is malformed.
#[cfg(feature = "webhook")]
pub fn sign(secrets: &[String], id: &str, timestamp: i64, body: &[u8]) -> Result<String, String> {
    let keys = secrets
        .iter()
        .enumerate()
        .map(|(i, s)| SigningKey::parse(s).map_err(|e| format!("secret {i}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(signature_header(&keys, id, timestamp, body))
}

/// [`sign`] with keys already parsed.
#[cfg(feature = "webhook")]
pub(crate) fn signature_header(
    keys: &[SigningKey],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    keys.iter()
        .map(|k| k.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(all(test, feature = "webhook"))]
mod tests {
    use super::*;

    /// The test vector of the Standard Webhooks reference libraries.
    #[test]
    fn signs_the_standard_webhooks_test_vector() {
        let key = SigningKey::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        assert_eq!(
            key.sign(
                "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
                1649367553,
                br#"{"email":"test@example.com","username":"test_user"}"#
            ),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    /// A raw string is the same key as `whsec_` followed by its base64.
    #[test]
    fn a_raw_secret_is_its_utf8_bytes() {
        let raw = "a raw secret of more than 24 bytes";
        let encoded = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        );
        let (a, b) = (
            SigningKey::parse(raw).unwrap(),
            SigningKey::parse(&encoded).unwrap(),
        );
        assert_eq!(a.sign("id", 1, b"body"), b.sign("id", 1, b"body"));
    }

    #[test]
    fn refuses_short_keys_and_bad_base64_without_repeating_them() {
        let short = SigningKey::parse("hunter2").err().unwrap();
        assert!(
            short.contains("7 bytes") && !short.contains("hunter2"),
            "{short}"
        );
        let bad = SigningKey::parse("whsec_not*base64").err().unwrap();
        assert!(
            bad.contains("not base64") && !bad.contains("not*base64"),
            "{bad}"
        );
    }

    #[test]
    fn several_secrets_give_space_separated_signatures() {
        let secrets = vec!["k".repeat(24), "l".repeat(24)];
        let header = sign(&secrets, "id", 7, b"x").unwrap();
        let parts: Vec<_> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        assert_ne!(parts[0], parts[1]);
    }
}
