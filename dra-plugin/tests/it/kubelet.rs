//! The plugin as the kubelet sees it: the registration socket appears in `plugins_registry`, GetInfo names the
//! DRA socket, NotifyRegistrationStatus tells the outcome, then prepare and unprepare on the DRA socket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use peerpods_dra_plugin::api::dra::dra_plugin_client::DraPluginClient;
use peerpods_dra_plugin::api::dra::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use peerpods_dra_plugin::api::pluginregistration::registration_client::RegistrationClient;
use peerpods_dra_plugin::api::pluginregistration::{InfoRequest, RegistrationStatus};
use tonic::transport::{Channel, Endpoint};

const DRIVER: &str = "vm.peerpods.io";
/// Long enough for a loaded 2-core machine; the plugin is up in milliseconds.
const STARTUP: Duration = Duration::from_secs(60);

/// The plugin binary running on a kubelet directory of its own; killed if a test ends before stopping it.
struct Plugin {
    child: Child,
    kubelet_dir: tempfile::TempDir,
    log: PathBuf,
}

impl Plugin {
    /// Starts the binary as the DaemonSet does, with `prepare` run on the kubelet directory first.
    fn start(prepare: impl FnOnce(&Path)) -> Plugin {
        let kubelet_dir = tempfile::tempdir().unwrap();
        prepare(kubelet_dir.path());
        let log = kubelet_dir.path().join("plugin.log");
        let child = Command::new(env!("CARGO_BIN_EXE_peerpods-dra-plugin"))
            .args(["--driver-name", DRIVER, "--kubelet-dir"])
            .arg(kubelet_dir.path())
            .env("NODE_NAME", "node-1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Plugin {
            child,
            kubelet_dir,
            log,
        }
    }

    fn registration_socket(&self) -> PathBuf {
        registration_socket(self.kubelet_dir.path())
    }

    fn dra_socket(&self) -> PathBuf {
        dra_socket(self.kubelet_dir.path())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the registration socket answers (a stale socket left there refuses connections), as the
    /// kubelet's plugin watcher finds it, and returns the watcher's client.
    async fn registration(&mut self) -> RegistrationClient<Channel> {
        let socket = self.registration_socket();
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the plugin exited with {status}:\n{}", self.log());
            }
            if is_socket(&socket)
                && let Ok(channel) = endpoint(&socket).connect().await
            {
                return RegistrationClient::new(channel);
            }
            assert!(
                Instant::now() < deadline,
                "nothing answers at {}:\n{}",
                socket.display(),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends SIGTERM (the kubelet stopping the pod) and waits for the exit.
    async fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        self.exit().await
    }

    async fn exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the plugin did not exit:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn registration_socket(kubelet_dir: &Path) -> PathBuf {
    kubelet_dir
        .join("plugins_registry")
        .join(format!("{DRIVER}-reg.sock"))
}

fn dra_socket(kubelet_dir: &Path) -> PathBuf {
    kubelet_dir.join("plugins").join(DRIVER).join("dra.sock")
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// A gRPC endpoint on a Unix socket, as the kubelet dials its plugins (`unix:<path>`).
fn endpoint(socket: &Path) -> Endpoint {
    Endpoint::from_shared(format!("unix:{}", socket.display())).unwrap()
}

async fn dial(socket: &Path) -> Channel {
    endpoint(socket).connect().await.unwrap()
}

fn claim(namespace: &str, uid: &str, name: &str) -> Claim {
    Claim {
        namespace: namespace.into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn the_kubelet_registers_the_plugin_and_prepares_and_unprepares_claims() {
    let mut plugin = Plugin::start(|_| {});
    // The plugin watcher: GetInfo, then the outcome.
    let mut registration = plugin.registration().await;
    let info = registration
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(Path::new(&info.endpoint), plugin.dra_socket());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();

    // The DRA manager, on the endpoint GetInfo named.
    let mut dra = DraPluginClient::new(dial(Path::new(&info.endpoint)).await);
    let claims = vec![
        claim("web", "uid-1", "web-0-vm"),
        claim("web", "uid-2", "web-1-vm"),
    ];
    let prepared = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: claims.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(prepared.claims.len(), 2, "{prepared:?}");
    for uid in ["uid-1", "uid-2"] {
        let answer = &prepared.claims[uid];
        assert_eq!(answer.error, "", "{uid}");
        assert!(answer.devices.is_empty(), "nothing to inject: {answer:?}");
    }
    // Unprepared, and again (the kubelet retries and unprepares after its own restart): no memory needed.
    for _ in 0..2 {
        let unprepared = dra
            .node_unprepare_resources(NodeUnprepareResourcesRequest {
                claims: claims.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(unprepared.claims.len(), 2, "{unprepared:?}");
        assert!(
            unprepared.claims.values().all(|c| c.error.is_empty()),
            "{unprepared:?}"
        );
    }

    // A claim without a name is answered with its own error; the others are still prepared.
    let prepared = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim("web", "uid-3", ""), claim("web", "uid-4", "ok")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(prepared.claims["uid-3"].error, "claim uid-3 has no name");
    assert_eq!(prepared.claims["uid-4"].error, "");
    // A claim without a UID cannot be answered: the request is INVALID_ARGUMENT, and the plugin keeps serving.
    for status in [
        dra.node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim("web", "uid-5", "a"), claim("web", "", "b")],
        })
        .await
        .unwrap_err(),
        dra.node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim("web", "", "b")],
        })
        .await
        .unwrap_err(),
    ] {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().ends_with("of the request has no uid"),
            "{status:?}"
        );
    }
    registration.get_info(InfoRequest {}).await.unwrap();

    // SIGTERM: a clean exit, and both sockets gone (the watcher deregisters on the registration socket's removal).
    let status = plugin.terminate().await;
    assert!(status.success(), "{status}:\n{}", plugin.log());
    assert!(!plugin.registration_socket().exists(), "{}", plugin.log());
    assert!(!plugin.dra_socket().exists(), "{}", plugin.log());
}

#[tokio::test]
async fn stale_sockets_of_a_killed_plugin_are_replaced() {
    let mut plugin = Plugin::start(|dir| {
        for socket in [registration_socket(dir), dra_socket(dir)] {
            std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
            // Bound and dropped: the file stays, nobody listens (what a SIGKILLed plugin leaves).
            drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        }
    });
    let mut registration = plugin.registration().await;
    let info = registration
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut dra = DraPluginClient::new(dial(Path::new(&info.endpoint)).await);
    dra.node_prepare_resources(NodePrepareResourcesRequest {
        claims: vec![claim("web", "uid-1", "a")],
    })
    .await
    .unwrap();
    assert!(plugin.terminate().await.success(), "{}", plugin.log());
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_left_alone_and_the_plugin_stops() {
    let mut plugin = Plugin::start(|dir| {
        let path = registration_socket(dir);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "not a socket").unwrap();
    });
    let status = plugin.exit().await;
    assert!(!status.success(), "{}", plugin.log());
    assert!(plugin.log().contains("is not a socket"), "{}", plugin.log());
    // Why it stopped, logged once with the error's reason, as every service's main logs it.
    assert!(
        plugin
            .log()
            .lines()
            .any(|l| l.contains("peerpods-dra-plugin stopped") && l.contains("NotASocket")),
        "{}",
        plugin.log()
    );
    assert_eq!(
        std::fs::read_to_string(plugin.registration_socket()).unwrap(),
        "not a socket"
    );
    // The DRA socket, bound before, was removed on the way out.
    assert!(!plugin.dra_socket().exists(), "{}", plugin.log());
}

/// The kubelet's plugin watcher dials the registration socket by its bare path, and grpc-go then sends the path as
/// the `:authority` of GetInfo (Rust clients cannot: their HTTP/2 refuses such an authority, so this writes the
/// frames itself). The plugin answers it; without the rewrite, tonic's HTTP/2 resets the stream (PROTOCOL_ERROR)
/// and the real kubelet never registers the driver.
#[tokio::test]
async fn get_info_with_the_socket_path_as_authority_is_answered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut plugin = Plugin::start(|_| {});
    drop(plugin.registration().await);
    let socket = plugin.registration_socket();
    let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();

    // HPACK literals without indexing: name index + plain string (length in a 7-bit prefix).
    let string = |out: &mut Vec<u8>, value: &[u8]| {
        let mut len = value.len();
        if len < 127 {
            out.push(u8::try_from(len).unwrap());
        } else {
            out.push(127);
            len -= 127;
            while len >= 128 {
                out.push(u8::try_from(len % 128).unwrap() | 0x80);
                len /= 128;
            }
            out.push(u8::try_from(len).unwrap());
        }
        out.extend_from_slice(value);
    };
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    block.push(0x04); // :path
    string(&mut block, b"/pluginregistration.Registration/GetInfo");
    block.push(0x01); // :authority, as grpc-go sends it for a bare path
    string(&mut block, socket.display().to_string().as_bytes());
    block.extend([0x0F, 0x10]); // content-type (static index 31)
    string(&mut block, b"application/grpc");
    block.push(0x00); // te, a new name
    string(&mut block, b"te");
    string(&mut block, b"trailers");
    let frame = |kind: u8, flags: u8, stream_id: u8, payload: &[u8]| {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut out = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, stream_id];
        out.extend_from_slice(payload);
        out
    };
    let mut request = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    request.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    request.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    request.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // DATA: an empty InfoRequest, END_STREAM
    stream.write_all(&request).await.unwrap();

    // Frames until the answer's DATA on stream 1 (or a reset, or the connection's end).
    let answer = tokio::time::timeout(STARTUP, async {
        loop {
            let mut header = [0u8; 9];
            stream.read_exact(&mut header).await.unwrap();
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let mut payload = vec![0; len];
            stream.read_exact(&mut payload).await.unwrap();
            match (header[3], header[8]) {
                (0x0, 1) => return Ok(payload),
                (0x3, 1) => return Err(format!("RST_STREAM {payload:?}")),
                (0x7, _) => return Err(format!("GOAWAY {payload:?}")),
                _ => {}
            }
        }
    })
    .await
    .unwrap();
    let payload = answer.unwrap_or_else(|e| panic!("GetInfo refused: {e}\n{}", plugin.log()));
    // A gRPC message (5-byte prefix) holding PluginInfo: type DRAPlugin among its bytes.
    let info = String::from_utf8_lossy(&payload);
    assert!(
        info.contains("DRAPlugin") && info.contains(DRIVER),
        "{info:?}"
    );
    // The kubelet closes its registration connection when done; a graceful stop waits for open ones.
    drop(stream);
    assert!(plugin.terminate().await.success(), "{}", plugin.log());
}
