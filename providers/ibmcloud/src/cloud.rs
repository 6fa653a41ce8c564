//! An authenticated API of one backend: the HTTP layer (`http`) with IAM's bearer tokens
//! (`iam`). Kept apart from both so that `iam` can use `http` to exchange its key without the
//! two depending on each other.

use peerpods_provider_core::Error;
use reqwest::StatusCode;

use crate::http::{Answer, Http};
use crate::iam::{Iam, Token};

/// An authenticated API of one backend: its HTTP client and its IAM token source.
pub struct Cloud {
    pub http: Http,
    iam: Iam,
}

impl Cloud {
    pub fn new(http: Http, iam: Iam) -> Self {
        Cloud { http, iam }
    }

    /// Sends an authenticated request; a refused token is exchanged once and the request sent
    /// again. Returns success and "gone" answers (see [`Answer::is_gone`]); every other answer
    /// is an error.
    pub async fn call(
        &self,
        operation: &'static str,
        what: &str,
        build: impl Fn(&reqwest::Client, &Token) -> reqwest::RequestBuilder,
    ) -> Result<Answer, Error> {
        self.call_answering(operation, what, |_| false, build).await
    }

    /// [`Cloud::call`] that also returns the answers `also` accepts (e.g. a 409 the caller
    /// reads as a refusal for the resource's state) instead of making them errors.
    pub async fn call_answering(
        &self,
        operation: &'static str,
        what: &str,
        also: impl Fn(StatusCode) -> bool,
        build: impl Fn(&reqwest::Client, &Token) -> reqwest::RequestBuilder,
    ) -> Result<Answer, Error> {
        let mut token = self.iam.token(&self.http).await?;
        let mut exchanged_again = false;
        loop {
            let answer = self
                .http
                .send(operation, what, || build(self.http.client(), &token))
                .await?;
            if answer.is_success() || answer.is_gone() || also(answer.status) {
                return Ok(answer);
            }
            if answer.status == StatusCode::UNAUTHORIZED && !exchanged_again {
                self.iam.forget(&token).await;
                token = self.iam.token(&self.http).await?;
                exchanged_again = true;
                continue;
            }
            return Err(answer.into_error(what, &self.http));
        }
    }
}
