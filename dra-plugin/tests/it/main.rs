//! peerpods-dra-plugin's integration tests, one binary: the built plugin in a temporary kubelet directory, called
//! over its Unix sockets as the kubelet calls it (plugin watcher, then DRA manager).
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod kubelet;
