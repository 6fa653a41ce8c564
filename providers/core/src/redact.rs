//! Keeping credentials out of everything a backend reports.

/// Removes configured secrets from text that may reach logs, errors or metrics. Cloud error texts
/// do not normally contain them, but a signature mismatch or an echoing proxy may repeat request
/// details, so every backend passes cloud texts through one before they leave it.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            // Very short values would redact ordinary words; real keys are 16+ characters.
            secrets: secrets
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| s.len() >= 4)
                .collect(),
        }
    }

    pub fn redact(&self, text: &str) -> String {
        self.secrets.iter().fold(text.to_owned(), |text, secret| {
            text.replace(secret, "[redacted]")
        })
    }
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_secrets_never_survive() {
        let r = Redactor::new(["s3cr3t-value", "ab"]);
        assert_eq!(
            r.redact("signature for s3cr3t-value mismatch, ab"),
            "signature for [redacted] mismatch, ab"
        );
        assert_eq!(format!("{r:?}"), "Redactor(1 secrets)");
    }
}
