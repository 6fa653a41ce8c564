//! The count of PeerPods holding `peer.pod/finalizer` that the chart's uninstall protection reads
//! (`peerpod_ctrl::in_use`): written into its ConfigMap, owned by the binding, as PeerPods gain and lose the
//! finalizer, from a reflector's cache as the controller's.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use peerpod_ctrl::in_use::{self, InUseSettings};
use peerpods_api::peerpod::{FINALIZER, PeerPod, PeerPodSpec};

const NAME: &str = "peerpods-provider-service-in-use";

async fn peerpod(api: &Api<PeerPod>, name: &str, finalizer: bool) {
    let mut p = PeerPod::new(
        name,
        PeerPodSpec {
            cloud_provider: "libvirt".into(),
            instance_id: format!("vm-{name}"),
        },
    );
    if finalizer {
        p.metadata.finalizers = Some(vec![FINALIZER.into()]);
    }
    api.create(&PostParams::default(), &p).await.unwrap();
}

async fn finalizers(api: &Api<PeerPod>, name: &str, finalizers: &[&str]) {
    let patch = serde_json::json!({"metadata": {"finalizers": finalizers}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Waits until ConfigMap `name` says `count` and names `named`.
async fn published(
    config_maps: &Api<ConfigMap>,
    name: &str,
    count: &str,
    named: &str,
) -> ConfigMap {
    let want = BTreeMap::from([
        ("count".to_owned(), count.to_owned()),
        ("peerpods".to_owned(), named.to_owned()),
    ]);
    testenv::wait_for(
        &format!("the count {want:?}"),
        Duration::from_secs(20),
        || async {
            let cm = config_maps.get_opt(name).await.ok()??;
            (cm.data.as_ref() == Some(&want)).then_some(cm)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_count_follows_the_peerpods_holding_the_finalizer() {
    // A control plane of its own: the scenarios' controllers watch every namespace, and this test's libvirt
    // PeerPods (no VM behind them) would be reverse collection's missing instances in a scenario running beside it.
    let cp = testenv::shared_for(module_path!());
    let client = cp.client().await;
    testenv::apply_crds(&client, "deploy/crds/peerpods.yaml").await;
    let ns = testenv::namespace(&client, "in-use").await;
    // The chart's binding, named as the ConfigMap; its policy need not exist for the owner reference.
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let binding_name = format!("{ns}-{NAME}");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": binding_name},
        "spec": {"policyName": binding_name, "validationActions": ["Deny"],
                 "paramRef": {"name": binding_name, "namespace": ns, "parameterNotFoundAction": "Deny"}}
    }))
    .unwrap();
    let binding = bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // The controller's cache, here of this namespace's PeerPods only.
    let peerpods: Api<PeerPod> = Api::namespaced(client.clone(), &ns);
    peerpod(&peerpods, "held-before-start", true).await;
    let (store, writer) = reflector::store();
    let watch = reflector(
        writer,
        watcher(peerpods.clone(), watcher::Config::default()),
    )
    .applied_objects()
    .for_each(|_| futures::future::ready(()));
    let (tx, rx) = tokio::sync::watch::channel(Some(store));
    let settings = InUseSettings {
        namespace: ns.clone(),
        name: binding_name.clone(),
    };
    let follow = in_use::follow(client.clone(), settings, rx);
    let task = tokio::spawn(async move {
        tokio::join!(watch, follow);
    });

    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let a = format!("{ns}/held-before-start");
    let b = format!("{ns}/later");
    let cm = published(&config_maps, &binding_name, "1", &a).await;
    let owner = &cm.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), Some(&owner.uid)),
        (
            "ValidatingAdmissionPolicyBinding",
            binding_name.as_str(),
            binding.metadata.uid.as_ref()
        ),
        "owned by the binding, so it goes with it"
    );

    // Without the finalizer a PeerPod is not counted; gaining it, it is.
    peerpod(&peerpods, "later", false).await;
    finalizers(&peerpods, "later", &["other.example/keep", FINALIZER]).await;
    published(&config_maps, &binding_name, "2", &format!("{a}, {b}")).await;
    // Losing it (CAA or peerpod-ctrl released it), it is not, whatever other finalizer it keeps.
    finalizers(&peerpods, "held-before-start", &[]).await;
    published(&config_maps, &binding_name, "1", &b).await;
    // Being deleted, it counts until the finalizer is released.
    peerpods
        .delete("later", &DeleteParams::default())
        .await
        .unwrap();
    published(&config_maps, &binding_name, "1", &b).await;
    finalizers(&peerpods, "later", &["other.example/keep"]).await;
    published(&config_maps, &binding_name, "0", "").await;

    task.abort();
    drop(tx);
    finalizers(&peerpods, "later", &[]).await;
    bindings
        .delete(&binding_name, &DeleteParams::default())
        .await
        .unwrap();
}
