//! Adoption before reaping: cloud-api-adaptor's names (`podvm-<pod>-<sandbox>` for a VM,
//! `<pod>-resource-<random>` for its PeerPod) tie an untracked VM to a live Pod, and a PeerPod without an
//! instance id to its VM.

use std::time::Duration;

use crate::support::{ControllerOptions, Scenario, TAG_KEY, TAG_VALUE};
use kube::api::DeleteParams;
use peerpod_ctrl::orphans::{OrphanCap, OrphanPolicy};
use peerpods_api::peerpod::EventReason;

const MINUTE: Duration = Duration::from_secs(60);

/// An untracked VM named for a live Pod survives the delete policy and is reported adoptable, on libvirt and
/// on AWS (the `Name` tag, against moto); one named for a Pod that does not exist (a longer name than the
/// live Pod's) is deleted as an orphan; and once its Pod is deleted, the adoptable VM is an orphan too.
#[tokio::test(flavor = "multi_thread")]
async fn an_orphan_named_for_a_live_pod_survives_the_delete_policy_until_its_pod_is_gone() {
    use test_support::moto;

    let s = Scenario::start("adopt").await;
    let (_moto_serial, ec2) = moto::alone().await;
    let clouds = moto::moto().config(&[("CLOUD_PROVIDER", "libvirt,aws")]);
    let provider = crate::support::ProviderService::start_with_config(&clouds).await;
    let pod = s.create_pod("adopt-live").await;
    let tagged = [(TAG_KEY, TAG_VALUE)];
    let adoptable = s.define_named_domain(Some("podvm-adopt-live-0123abcd"), &tagged);
    // The live Pod's name is a prefix of this one's pod part: still an orphan.
    let orphan = s.define_named_domain(Some("podvm-adopt-live-x-89abcdef"), &tagged);
    let aws_adoptable = moto::run_instances(
        &ec2,
        1,
        &[(TAG_KEY, TAG_VALUE), ("Name", "podvm-adopt-live-4567cdef")],
    )
    .await
    .remove(0);

    let mut options = ControllerOptions::scanning_orphans(provider.addr, OrphanPolicy::Delete);
    options.orphan_cap = OrphanCap {
        max: 10,
        max_percent: 100,
    };
    let ctrl = s.start_controller(options).await;
    testenv::wait_for("the orphan deleted", MINUTE, || async {
        (!s.domain_exists(&orphan)).then_some(())
    })
    .await;
    let scans = ctrl.metric("peerpod_ctrl_orphan_scans_total", &[]);
    testenv::wait_for("two more orphan scans", MINUTE, || async {
        (ctrl.metric("peerpod_ctrl_orphan_scans_total", &[]) >= scans + 2).then_some(())
    })
    .await;
    assert!(
        s.domain_exists(&adoptable),
        "a live Pod's VM is never deleted"
    );
    assert_eq!(moto::state_of(&ec2, &aws_adoptable).await, "running");
    for cloud in ["libvirt", "aws"] {
        assert_eq!(
            ctrl.metric("peerpod_ctrl_adoptable_instances", &[("provider", cloud)]),
            1,
            "{cloud}"
        );
        assert_eq!(
            ctrl.metric("peerpod_ctrl_orphan_instances", &[("provider", cloud)]),
            0,
            "{cloud}: not counted as an orphan"
        );
    }
    // One Event per adoptable VM, naming the VM and the Pod.
    for (cloud, vm) in [("libvirt", &adoptable), ("aws", &aws_adoptable)] {
        let found = s
            .wait_event("default", "an Event per adoptable VM", |e| {
                e.reason.as_deref() == Some(EventReason::AdoptableInstanceFound.as_str())
                    && e.related.as_ref().and_then(|r| r.name.clone())
                        == Some(format!("{cloud}/{vm}"))
            })
            .await;
        let note = found.note.unwrap_or_default();
        assert!(note.contains(vm.as_str()), "{note}");
        assert!(note.contains(&format!("{}/adopt-live", s.ns)), "{note}");
    }

    // The Pod goes (unscheduled, it is gone at once): its VMs are orphans like any other.
    s.pods()
        .delete("adopt-live", &DeleteParams::default())
        .await
        .expect("delete Pod");
    drop(pod);
    testenv::wait_for("the VMs of the deleted Pod deleted", MINUTE, || async {
        (!s.domain_exists(&adoptable) && moto::state_of(&ec2, &aws_adoptable).await == "terminated")
            .then_some(())
    })
    .await;
    s.finish(ctrl).await;
}

/// A PeerPod without an instance id shows the one VM its name matches in `status.matchedInstance`, and
/// nothing when two VMs match; neither VM is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn a_peerpod_without_an_instance_id_shows_its_vm_only_when_exactly_one_matches() {
    let (s, provider) = Scenario::with_provider("adopt-id").await;
    let one = s.define_named_domain(Some("podvm-adopt-one-0123abcd"), &[]);
    let two = [
        s.define_named_domain(Some("podvm-adopt-two-0123abcd"), &[]),
        s.define_named_domain(Some("podvm-adopt-two-4567cdef"), &[]),
    ];
    // A VM of another Pod whose name begins alike: no match for adopt-one.
    let other = s.define_named_domain(Some("podvm-adopt-one-b-89abcdef"), &[]);
    let pod_one = s.create_pod("adopt-one").await;
    let pod_two = s.create_pod("adopt-two").await;
    s.create_peerpod("adopt-one-resource-x7b2k", Some(&pod_one), "libvirt", "")
        .await;
    s.create_peerpod("adopt-two-resource-q4z9w", Some(&pod_two), "libvirt", "")
        .await;

    let mut options = ControllerOptions::new(provider.addr);
    options.reverse_interval = Duration::from_millis(500);
    let ctrl = s.start_controller(options).await;
    s.wait_peerpod("adopt-one-resource-x7b2k", "its VM matched", |p| {
        p.status
            .as_ref()
            .and_then(|st| st.matched_instance.as_deref())
            == Some(one.as_str())
    })
    .await;
    s.wait_event_reason(
        "adopt-one-resource-x7b2k",
        EventReason::InstanceMatchedByName.as_str(),
    )
    .await;
    // A PeerPod created now is matched by a later scan, so the scan that matched adopt-one (which saw
    // adopt-two as well) has ended by then.
    let three = s.define_named_domain(Some("podvm-adopt-three-0123abcd"), &[]);
    let pod_three = s.create_pod("adopt-three").await;
    s.create_peerpod(
        "adopt-three-resource-k2m8p",
        Some(&pod_three),
        "libvirt",
        "",
    )
    .await;
    s.wait_peerpod("adopt-three-resource-k2m8p", "its VM matched", |p| {
        p.status
            .as_ref()
            .and_then(|st| st.matched_instance.as_deref())
            == Some(three.as_str())
    })
    .await;
    let ambiguous = s
        .peerpods()
        .get("adopt-two-resource-q4z9w")
        .await
        .expect("PeerPod");
    assert_eq!(
        ambiguous.status.and_then(|st| st.matched_instance),
        None,
        "two VMs match: none is shown"
    );
    for vm in two.iter().chain([&one, &three, &other]) {
        assert!(s.domain_exists(vm), "nothing is deleted on the name alone");
    }
    assert_eq!(provider.delete_calls("libvirt"), 0);
    s.remove_domains(two.iter().chain([&one, &three, &other]));
    s.finish(ctrl).await;
}
