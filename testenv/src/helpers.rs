use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{
    TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};

/// The repository root (this crate lives in `<root>/testenv`).
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// The name the test harness knows a test by, from the path of the module it is in (`module_path!()`) and its
/// function's name: the module path below the test crate's root (`it::telemetry` gives `telemetry::<function>`).
/// For re-running one test of the binary in a child process with `--exact`; [`crate::test_name!`] fills in the
/// module path.
pub fn harness_name(module_path: &str, function: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{function}"),
        None => function.to_owned(),
    }
}

/// The name the test harness knows test `$function` of the calling module by ([`harness_name`]).
#[macro_export]
macro_rules! test_name {
    ($function:literal) => {
        $crate::harness_name(module_path!(), $function)
    };
}

/// Set in the child process [`in_a_process_of_its_own`] starts.
const OWN_PROCESS_ENV: &str = "TESTENV_OWN_PROCESS";

/// Runs the test `test_name` (of the calling test binary; [`crate::test_name!`] gives it) again in a child process
/// of its own with `env` set, and returns `true` when called there. Outside, it waits for that run, asserts it
/// passed and returns `false`. For a test that sets something process-wide (the global tracing subscriber, an
/// environment variable read at start-up) in a test binary whose other tests run beside it:
///
/// ```ignore
/// if !testenv::in_a_process_of_its_own(&testenv::test_name!("my_test"), &[]) { return; }
/// ```
///
/// # Panics
/// Outside: when the child cannot be started or its run of the test fails (with its output).
pub fn in_a_process_of_its_own(test_name: &str, env: &[(&str, String)]) -> bool {
    if std::env::var_os(OWN_PROCESS_ENV).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let child = std::process::Command::new(exe)
        .args([test_name, "--exact", "--include-ignored", "--nocapture"])
        .env(OWN_PROCESS_ENV, "1")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("running the test in a process of its own");
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success() && stdout.contains("1 passed"),
        "{test_name} failed in its own process:\n{stdout}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );
    false
}

/// Creates a namespace named `<prefix>-<random>` and waits until its `default` ServiceAccount exists (Pods
/// cannot be created before that). Returns its name.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let created = namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {prefix}-*: {e}"));
    let name = created.metadata.name.unwrap_or_default();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    wait_for(
        &format!("ServiceAccount default in {name}"),
        Duration::from_secs(30),
        || async { accounts.get_opt("default").await.ok().flatten() },
    )
    .await;
    name
}

/// Applies every CustomResourceDefinition in a YAML file (one or more documents; the path is relative to the
/// repository root) with server-side apply, then waits until each is Established.
pub async fn apply_crds(client: &Client, repo_relative_path: &str) {
    let path = repo_root().join(repo_relative_path);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let crds: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("testenv").force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
        wait_for(
            &format!("CRD {name} Established"),
            Duration::from_secs(30),
            || async {
                let crd = api.get(&name).await.ok()?;
                let established = crd
                    .status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                established.then_some(())
            },
        )
        .await;
    }
}

/// Polls `check` every 100 ms until it returns `Some`, and returns that value.
///
/// # Panics
/// After `timeout`, naming `what` was awaited.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls the Events of `events` every 100 ms until one matches `check`, and returns it.
///
/// # Panics
/// After `timeout`, naming `what` was awaited.
pub async fn wait_for_event(
    what: &str,
    events: &Api<Event>,
    timeout: Duration,
    check: impl Fn(&Event) -> bool,
) -> Event {
    wait_for(what, timeout, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| check(e))
    })
    .await
}

/// How the API server names the credential `token` is (its user extra [`crate::audit::CREDENTIAL_ID`], e.g.
/// `JTI=<id>` for a ServiceAccount token), asked with a TokenReview: audit events carry the same name, so a test
/// can tell the requests made with one token from those made with another of the same ServiceAccount.
pub async fn credential_id(client: &Client, token: &str) -> String {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            ..TokenReviewSpec::default()
        },
        ..TokenReview::default()
    };
    let answer = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("TokenReview: {e}"));
    answer
        .status
        .and_then(|s| s.user)
        .and_then(|u| u.extra)
        .and_then(|mut extra| extra.remove(crate::audit::CREDENTIAL_ID))
        .and_then(|ids| ids.into_iter().next())
        .unwrap_or_else(|| panic!("the API server names no credential for this token"))
}

/// Mints a token for ServiceAccount `ns/sa` with the TokenRequest API, creating the ServiceAccount if missing.
pub async fn service_account_token(
    client: &Client,
    ns: &str,
    sa: &str,
    audiences: &[&str],
) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    if accounts.get_opt(sa).await.ok().flatten().is_none() {
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(sa.to_owned()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        match accounts.create(&PostParams::default(), &account).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating ServiceAccount {ns}/{sa}: {e}"),
        }
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(audiences.iter().map(|a| (*a).to_owned()).collect()),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let response = accounts
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {ns}/{sa}: {e}"));
    response.status.and_then(|s| s.token).unwrap_or_default()
}

/// Grants ServiceAccount `ns/sa` what the chart grants Prometheus: `get` on the non-resource URL `/metrics`
/// (a ClusterRole and its binding, both named `<ns>-metrics-reader`).
pub async fn grant_metrics_reader(client: &Client, ns: &str, sa: &str) {
    let name = format!("{ns}-metrics-reader");
    Api::<ClusterRole>::all(client.clone())
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                rules: Some(vec![PolicyRule {
                    non_resource_urls: Some(vec!["/metrics".into()]),
                    verbs: vec!["get".into()],
                    ..PolicyRule::default()
                }]),
                ..ClusterRole::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("creating ClusterRole {name}: {e}"));
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: name.clone(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: sa.to_owned(),
                    namespace: Some(ns.to_owned()),
                    ..Subject::default()
                }]),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("creating ClusterRoleBinding {name}: {e}"));
}

#[cfg(test)]
mod tests {
    use super::harness_name;

    #[test]
    fn a_tests_harness_name_is_its_path_below_the_crate_root() {
        assert_eq!(harness_name("it::telemetry", "spans"), "telemetry::spans");
        assert_eq!(harness_name("it::deploy::chart", "x"), "deploy::chart::x");
        assert_eq!(harness_name("isolation", "probe"), "probe");
    }
}
