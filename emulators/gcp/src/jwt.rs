//! Checking the self-signed JWTs a service-account key produces (what `google-cloud-auth`
//! sends as the bearer token): RS256 signature by the trusted key, issuer, key id, expiry and
//! a Compute Engine scope.

use base64::prelude::{BASE64_STANDARD, BASE64_URL_SAFE_NO_PAD, Engine as _};
use ring::signature::{RSA_PKCS1_2048_8192_SHA256, RsaKeyPair, UnparsedPublicKey};
use serde_json::Value;

/// Scopes that allow Compute Engine calls.
const SCOPES: [&str; 2] = [
    "https://www.googleapis.com/auth/compute",
    "https://www.googleapis.com/auth/cloud-platform",
];

/// The service account whose tokens are accepted.
pub struct TrustedKey {
    public_key: Vec<u8>,
    client_email: String,
    key_id: String,
}

impl TrustedKey {
    /// The public half of a service-account key file's `private_key`.
    pub fn from_service_account(json: &str) -> Result<Self, String> {
        let json: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let field = |name: &str| {
            json.get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("service-account key without {name}"))
        };
        let pem = field("private_key")?;
        let body: String = pem
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect();
        let der = BASE64_STANDARD.decode(body).map_err(|e| e.to_string())?;
        let key_pair = RsaKeyPair::from_pkcs8(&der).map_err(|e| e.to_string())?;
        Ok(TrustedKey {
            public_key: key_pair.public().as_ref().to_vec(),
            client_email: field("client_email")?,
            key_id: field("private_key_id")?,
        })
    }

    /// Why `token` is not acceptable at `now` (seconds since the epoch), or `Ok`.
    pub fn verify(&self, token: &str, now: u64) -> Result<(), &'static str> {
        let mut parts = token.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("not a JWT");
        };
        let signature = BASE64_URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| "signature is not base64url")?;
        let signed = &token[..header.len() + 1 + claims.len()];
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &self.public_key)
            .verify(signed.as_bytes(), &signature)
            .map_err(|_| "signature does not verify with the service account's key")?;
        let header = decode_json(header)?;
        if header["alg"] != "RS256" {
            return Err("alg is not RS256");
        }
        if header["kid"].as_str() != Some(self.key_id.as_str()) {
            return Err("kid is not the key's private_key_id");
        }
        let claims = decode_json(claims)?;
        if claims["iss"].as_str() != Some(self.client_email.as_str()) {
            return Err("iss is not the service account");
        }
        if claims["exp"].as_u64().is_none_or(|exp| exp <= now) {
            return Err("token expired");
        }
        if claims["iat"].as_u64().is_none_or(|iat| iat > now + 300) {
            return Err("token issued in the future");
        }
        let scopes = claims["scope"].as_str().unwrap_or_default();
        let audience_ok = claims["aud"]
            .as_str()
            .is_some_and(|aud| aud.contains("compute.googleapis.com"));
        if !audience_ok && !scopes.split(' ').any(|s| SCOPES.contains(&s)) {
            return Err("no Compute Engine scope");
        }
        Ok(())
    }
}

fn decode_json(part: &str) -> Result<Value, &'static str> {
    let bytes = BASE64_URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| "part is not base64url")?;
    serde_json::from_slice(&bytes).map_err(|_| "part is not JSON")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;

    const NOW: u64 = 1_800_000_000;

    fn key_pair(json: &str) -> RsaKeyPair {
        let json: Value = serde_json::from_str(json).expect("json");
        let body: String = json["private_key"]
            .as_str()
            .expect("key")
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        RsaKeyPair::from_pkcs8(&BASE64_STANDARD.decode(body).expect("b64")).expect("pkcs8")
    }

    fn token(signer: &RsaKeyPair, claims: Value) -> String {
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "0f3e1d5c2b4a69788796a5b4c3d2e1f0a9b8c7d6"});
        let signed = format!(
            "{}.{}",
            BASE64_URL_SAFE_NO_PAD.encode(header.to_string()),
            BASE64_URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0; signer.public().modulus_len()];
        signer
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signed.as_bytes(),
                &mut signature,
            )
            .expect("sign");
        format!("{signed}.{}", BASE64_URL_SAFE_NO_PAD.encode(signature))
    }

    fn claims() -> Value {
        serde_json::json!({
            "iss": "peer-pods@emulated-project.iam.gserviceaccount.com",
            "sub": "peer-pods@emulated-project.iam.gserviceaccount.com",
            "scope": "https://www.googleapis.com/auth/compute",
            "iat": NOW - 10,
            "exp": NOW + 3600,
        })
    }

    #[test]
    fn accepts_the_trusted_key_and_refuses_another() {
        let trusted = TrustedKey::from_service_account(crate::fixtures::SERVICE_ACCOUNT_KEY)
            .expect("trusted key");
        let right = key_pair(crate::fixtures::SERVICE_ACCOUNT_KEY);
        let wrong = key_pair(crate::fixtures::WRONG_SERVICE_ACCOUNT_KEY);
        assert_eq!(trusted.verify(&token(&right, claims()), NOW), Ok(()));
        assert_eq!(
            trusted.verify(&token(&wrong, claims()), NOW),
            Err("signature does not verify with the service account's key")
        );
    }

    #[test]
    fn refuses_expired_unscoped_and_foreign_tokens() {
        let trusted = TrustedKey::from_service_account(crate::fixtures::SERVICE_ACCOUNT_KEY)
            .expect("trusted key");
        let right = key_pair(crate::fixtures::SERVICE_ACCOUNT_KEY);
        let mut expired = claims();
        expired["exp"] = (NOW - 1).into();
        assert_eq!(
            trusted.verify(&token(&right, expired), NOW),
            Err("token expired")
        );
        let mut unscoped = claims();
        unscoped["scope"] = "https://www.googleapis.com/auth/pubsub".into();
        assert_eq!(
            trusted.verify(&token(&right, unscoped), NOW),
            Err("no Compute Engine scope")
        );
        let mut foreign = claims();
        foreign["iss"] = "someone@else.iam.gserviceaccount.com".into();
        assert_eq!(
            trusted.verify(&token(&right, foreign), NOW),
            Err("iss is not the service account")
        );
        assert_eq!(trusted.verify("a.b", NOW), Err("not a JWT"));
    }
}
