//! The webhook serving certificate: a private CA and a leaf for the webhook Service's DNS names, kept in Secret
//! `webhook-server-cert` (`tls.crt`, `tls.key`, `ca.crt`).
//!
//! The API server trusts `ca.crt` through the webhook configuration's caBundle. On rotation a new CA signs the new
//! leaf, and the previous CA stays in the bundle next to the new one: for the seconds between the bundle update and
//! the webhook pods reloading their certificate, either certificate is trusted, so pod creation never fails.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData,
};
use x509_parser::pem::Pem;

use crate::Error;
use peerpods_api::peerpodconfig::PeerPodConfig;

/// How long a new certificate is valid.
pub const VALIDITY: jiff::SignedDuration = jiff::SignedDuration::from_hours(365 * 24);
/// A certificate with less than this left is replaced.
pub const ROTATE_BEFORE: jiff::SignedDuration = jiff::SignedDuration::from_hours(30 * 24);

/// PEM contents of the serving certificate Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingCert {
    /// CA bundle: the CA that signed `cert_pem`, then possibly the previous CA.
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl ServingCert {
    /// Read from the Secret, if it has all three keys as UTF-8.
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let text = |key: &str| {
            data.get(key)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
        };
        Some(Self {
            ca_pem: text("ca.crt")?,
            cert_pem: text("tls.crt")?,
            key_pem: text("tls.key")?,
        })
    }

    /// Why this certificate cannot keep serving `dns_names` at `now` (None: it can).
    pub fn problem(&self, dns_names: &[String], now: jiff::Timestamp) -> Option<String> {
        let Some(leaf_pem) = first_pem(self.cert_pem.as_bytes()) else {
            return Some("tls.crt holds no certificate".into());
        };
        let Ok(leaf) = leaf_pem.parse_x509() else {
            return Some("tls.crt does not parse".into());
        };
        let Some(ca_pem) = first_pem(self.ca_pem.as_bytes()) else {
            return Some("ca.crt holds no certificate".into());
        };
        let Ok(ca) = ca_pem.parse_x509() else {
            return Some("ca.crt does not parse".into());
        };
        if KeyPair::from_pem(&self.key_pem)
            .map(|k| k.subject_public_key_info())
            .ok()
            .as_deref()
            != Some(leaf.public_key().raw)
        {
            return Some("tls.key does not belong to tls.crt".into());
        }
        if leaf.verify_signature(Some(ca.public_key())).is_err() {
            return Some("tls.crt is not signed by the first CA in ca.crt".into());
        }
        let not_after = leaf
            .validity()
            .not_after
            .timestamp()
            .min(ca.validity().not_after.timestamp());
        let not_before = leaf.validity().not_before.timestamp();
        if now.as_second() < not_before {
            return Some("certificate is not valid yet".into());
        }
        if not_after - now.as_second() < ROTATE_BEFORE.as_secs() {
            return Some("certificate expires soon".into());
        }
        let sans: Vec<String> = match leaf.subject_alternative_name() {
            Ok(Some(ext)) => ext
                .value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        dns_names
            .iter()
            .find(|name| !sans.contains(name))
            .map(|missing| format!("certificate is not valid for {missing}"))
    }

    /// The Secret holding this certificate, owned by `config`.
    pub fn to_secret(&self, config: &PeerPodConfig, namespace: &str) -> Result<Secret, Error> {
        let meta = crate::objects::secret_meta(config, namespace)?;
        Ok(Secret {
            metadata: meta,
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                (
                    "ca.crt".to_owned(),
                    ByteString(self.ca_pem.clone().into_bytes()),
                ),
                (
                    "tls.crt".to_owned(),
                    ByteString(self.cert_pem.clone().into_bytes()),
                ),
                (
                    "tls.key".to_owned(),
                    ByteString(self.key_pem.clone().into_bytes()),
                ),
            ])),
            ..Secret::default()
        })
    }
}

fn first_pem(bytes: &[u8]) -> Option<Pem> {
    Pem::iter_from_buffer(bytes).next()?.ok()
}

/// Keep `existing` when it can serve `dns_names`, else issue a new CA and leaf; the previous CA, if it still
/// parses and is unexpired, stays in the bundle. Returns the certificate to store and whether it is new.
pub fn ensure(
    existing: Option<ServingCert>,
    dns_names: &[String],
    now: jiff::Timestamp,
) -> Result<(ServingCert, Option<String>), Error> {
    let problem = match &existing {
        Some(cert) => cert.problem(dns_names, now),
        None => Some("no certificate yet".into()),
    };
    let Some(problem) = problem else {
        // `problem` is None only when `existing` is Some.
        return existing.map(|cert| (cert, None)).ok_or(Error::Certificate {
            message: "no certificate".into(),
            source: None,
        });
    };
    let mut issued = issue(dns_names, now)?;
    if let Some(previous_ca) = existing
        .as_ref()
        .and_then(|cert| still_valid_ca(&cert.ca_pem, now))
    {
        issued.ca_pem.push_str(&previous_ca);
    }
    Ok((issued, Some(problem)))
}

fn still_valid_ca(bundle: &str, now: jiff::Timestamp) -> Option<String> {
    let cert = first_pem(bundle.as_bytes())?;
    let unexpired = cert.parse_x509().ok()?.validity().not_after.timestamp() > now.as_second();
    // Keep the first block's text as it is: older CAs further down the bundle are dropped.
    const END: &str = "-----END CERTIFICATE-----";
    let start = bundle.find("-----BEGIN CERTIFICATE-----")?;
    let end = bundle[start..].find(END)? + start + END.len();
    unexpired.then(|| format!("{}\n", &bundle[start..end]))
}

/// A new CA and a leaf for `dns_names`, both valid from a day before `now` for [`VALIDITY`].
pub fn issue(dns_names: &[String], now: jiff::Timestamp) -> Result<ServingCert, Error> {
    let fail = |e: rcgen::Error| Error::Certificate {
        message: String::new(),
        source: Some(Box::new(e)),
    };
    let (from, until) = (
        day(now - jiff::SignedDuration::from_hours(24))?,
        day(now + VALIDITY)?,
    );
    let (not_before, not_after) = (
        rcgen::date_time_ymd(from.0, from.1, from.2),
        rcgen::date_time_ymd(until.0, until.1, until.2),
    );

    let ca_key = KeyPair::generate().map_err(fail)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "peer-pods webhook CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(fail)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let leaf_key = KeyPair::generate().map_err(fail)?;
    let mut leaf_params = CertificateParams::new(dns_names.to_vec()).map_err(fail)?;
    leaf_params.distinguished_name.push(
        DnType::CommonName,
        dns_names.first().cloned().unwrap_or_default(),
    );
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf_params.not_before = not_before;
    leaf_params.not_after = not_after;
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).map_err(fail)?;

    Ok(ServingCert {
        ca_pem: ca_cert.pem(),
        cert_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

/// rcgen takes calendar dates; day precision is plenty for certificates valid for a year.
fn day(at: jiff::Timestamp) -> Result<(i32, u8, u8), Error> {
    let date = at.to_zoned(jiff::tz::TimeZone::UTC).date();
    let out_of_range = |e: std::num::TryFromIntError| Error::Certificate {
        message: String::new(),
        source: Some(Box::new(e)),
    };
    let month = u8::try_from(date.month()).map_err(out_of_range)?;
    let day = u8::try_from(date.day()).map_err(out_of_range)?;
    Ok((i32::from(date.year()), month, day))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        crate::objects::webhook_dns_names("peer-pods")
    }

    #[test]
    fn fresh_certificate_is_kept() {
        let now = jiff::Timestamp::now();
        let (cert, why) = ensure(None, &names(), now).unwrap();
        assert_eq!(why.as_deref(), Some("no certificate yet"));
        assert_eq!(cert.problem(&names(), now), None);
        let (again, why) = ensure(Some(cert.clone()), &names(), now).unwrap();
        assert_eq!((again, why), (cert, None));
    }

    #[test]
    fn rotated_before_expiry_and_previous_ca_still_trusted() {
        let issued_at = jiff::Timestamp::now();
        let (cert, _) = ensure(None, &names(), issued_at).unwrap();
        let later = issued_at + VALIDITY - ROTATE_BEFORE + jiff::SignedDuration::from_hours(48);
        assert_eq!(
            cert.problem(&names(), later).as_deref(),
            Some("certificate expires soon")
        );
        let (rotated, why) = ensure(Some(cert.clone()), &names(), later).unwrap();
        assert_eq!(why.as_deref(), Some("certificate expires soon"));
        assert_ne!(rotated.cert_pem, cert.cert_pem);
        assert_eq!(rotated.problem(&names(), later), None);
        assert_eq!(rotated.ca_pem.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(
            rotated.ca_pem.ends_with(&cert.ca_pem),
            "previous CA kept after the new one"
        );
    }

    #[test]
    fn wrong_names_or_foreign_key_force_a_new_certificate() {
        let now = jiff::Timestamp::now();
        let (cert, _) = ensure(None, &names(), now).unwrap();
        let other_ns = crate::objects::webhook_dns_names("elsewhere");
        assert!(
            cert.problem(&other_ns, now)
                .unwrap()
                .contains("not valid for")
        );
        let (other, _) = ensure(None, &names(), now).unwrap();
        let mixed = ServingCert {
            key_pem: other.key_pem,
            ..cert.clone()
        };
        assert_eq!(
            mixed.problem(&names(), now).as_deref(),
            Some("tls.key does not belong to tls.crt")
        );
        let foreign_ca = ServingCert {
            ca_pem: other.ca_pem,
            ..cert
        };
        assert_eq!(
            foreign_ca.problem(&names(), now).as_deref(),
            Some("tls.crt is not signed by the first CA in ca.crt")
        );
        let garbage = ServingCert {
            ca_pem: "x".into(),
            cert_pem: "y".into(),
            key_pem: "z".into(),
        };
        assert!(garbage.problem(&names(), now).is_some());
    }
}
