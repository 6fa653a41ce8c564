//! A byom pool on the local control plane, written the way cloud-api-adaptor writes it, a
//! Kubernetes client that counts its requests and can run a competing write just before the
//! first update it forwards or right after updates the API server applied, and the provider behind
//! a fault layer in front of the real API server.

pub mod api_faults;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use peerpods_provider_byom::ByomProvider;
use peerpods_provider_core::{CloudCalls, ProviderConfig};

pub use test_support::byom::{CONFIGMAP, Pool, caa_allocate};

/// The provider-service config of `pool` (CAA's keys), plus `extra`.
pub fn config(pool: &Pool, extra: &[(&str, &str)]) -> ProviderConfig {
    let mut pairs: Vec<(String, String)> = pool
        .config()
        .into_iter()
        .filter(|(k, _)| k != "CLOUD_PROVIDER")
        .collect();
    pairs.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    ProviderConfig::from_pairs(pairs)
}

/// The provider as provider-service builds it, reaching the control plane as its admin.
pub async fn provider(pool: &Pool, calls: &CloudCalls) -> ByomProvider {
    let kube_config = testenv::shared().config().await.expect("kube config");
    ByomProvider::with_kube_config(&config(pool, &[]), kube_config, calls.clone())
        .expect("provider")
}

/// The provider as provider-service builds it (a client without kube's own retries), reaching
/// the control plane through a fault layer the test scripts.
pub async fn provider_behind_faults(
    pool: &Pool,
    extra: &[(&str, &str)],
    calls: &CloudCalls,
) -> (ByomProvider, api_faults::ApiFaults) {
    let faults = api_faults::ApiFaults::new(admin_without_retries().await);
    let provider =
        ByomProvider::with_client(&config(pool, extra), faults.client(&pool.ns), calls.clone())
            .expect("provider");
    (provider, faults)
}

/// An admin client of the control plane that, like the one the provider builds for itself, does
/// not retry on its own.
pub async fn admin_without_retries() -> Client {
    let mut kube_config = testenv::shared().config().await.expect("kube config");
    kube_config.default_retry = false;
    Client::try_from(kube_config).expect("client")
}

type Hook = Pin<Box<dyn Future<Output = ()> + Send>>;
type MakeHook = Arc<dyn Fn() -> Hook + Send + Sync>;

/// A Kubernetes client that forwards to `inner`, counting requests, and runs a hook (once)
/// before forwarding the first PUT, and one after each of the next PUTs the API server answered.
#[derive(Clone)]
pub struct Tap {
    inner: Client,
    requests: Arc<AtomicUsize>,
    before_first_put: Arc<Mutex<Option<Hook>>>,
    /// How many more PUTs run the hook after their answer, and the hook.
    after_puts: Arc<Mutex<Option<(usize, MakeHook)>>>,
}

impl Tap {
    pub fn new(inner: Client) -> Self {
        Self {
            inner,
            requests: Arc::default(),
            before_first_put: Arc::default(),
            after_puts: Arc::default(),
        }
    }

    pub fn before_first_put(&self, hook: impl Future<Output = ()> + Send + 'static) {
        *self.before_first_put.lock().expect("hook") = Some(Box::pin(hook));
    }

    /// Runs `hook()` after each of the next `times` PUTs, once the API server answered and before
    /// the client sees the answer: another writer's update right after ours, before our next
    /// request.
    pub fn after_puts<F, Fut>(&self, times: usize, hook: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let make: MakeHook = Arc::new(move || Box::pin(hook()));
        *self.after_puts.lock().expect("hook") = Some((times, make));
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn client(&self, ns: &str) -> Client {
        Client::new(self.clone(), ns)
    }
}

impl tower::Service<Request<Body>> for Tap {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let (hook, after) = if request.method() == Method::PUT {
            let mut after_puts = self.after_puts.lock().expect("hook");
            let after = match after_puts.as_mut() {
                Some((times, make)) if *times > 0 => {
                    *times -= 1;
                    Some(make())
                }
                _ => None,
            };
            (self.before_first_put.lock().expect("hook").take(), after)
        } else {
            (None, None)
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            if let Some(hook) = hook {
                hook.await;
            }
            let answer = inner.send(request).await;
            if let Some(after) = after.filter(|_| answer.is_ok()) {
                after.await;
            }
            answer
        })
    }
}
