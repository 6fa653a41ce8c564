//! Shutdown: one [`CancellationToken`] cancelled on SIGTERM or SIGINT, shared by every server
//! and loop of a process so they stop together.

pub use tokio_util::sync::CancellationToken;

/// Waits for SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C).
pub async fn signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            // Without a SIGTERM handler only Ctrl-C stops the process; say so rather than exit.
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = term => tracing::info!("SIGTERM received, shutting down"),
        r = tokio::signal::ctrl_c() => match r {
            Ok(()) => tracing::info!("SIGINT received, shutting down"),
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGINT"),
        },
    }
}

/// A token cancelled when the process receives SIGTERM or SIGINT.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let child = token.clone();
    tokio::spawn(async move {
        signal().await;
        child.cancel();
    });
    token
}
