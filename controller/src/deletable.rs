//! What the fast finalizer may delete, and when: ONE table of kinds and the condition each
//! deletion needs ([`DELETABLE`]). The finalizer asks [`permits`] before every delete; the
//! manifests test holds the controller's `delete` RBAC to the table's resources, and the rows of
//! the controller's fence (`manifests/base/controller/fence.yaml`, a ValidatingAdmissionPolicy on
//! its ServiceAccount) to what a request shows of each row: the resource, the label, the kind of
//! owner or the namespace's deletion. The uid and "being deleted" checks of [`permits`] stay
//! here: a policy sees no other object.
//!
//! Nothing is deleted because of its name or labels alone: a child is deleted for an owner only
//! when one of its ownerReferences names that owner's uid (labels only find the candidates), and
//! for a namespace only while that namespace is being deleted.

use holdfast_peers::{korifi, kpack};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A kind the fast finalizer deletes, and the condition a deletion needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deletable {
    /// The API group (`""` for core), version, kind and resource of the child.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub resource: &'static str,
    /// The label that finds the candidates (its value names the owner), if any.
    pub label: Option<&'static str>,
    pub condition: Condition,
    /// `Some(0)`: deleted without a grace period.
    pub grace_period_seconds: Option<i64>,
    /// The controller flag that enables these deletions (off by default); `None`: always on.
    pub opt_in: Option<&'static str>,
}

/// When a child may be deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// An ownerReference of the child names (by uid) an owner of this group and kind that is
    /// being deleted. `controller`: that reference must be the child's controller. `every`: all
    /// of the child's references to that kind must name owners being deleted or gone.
    OwnerTerminating {
        group: &'static str,
        kind: &'static str,
        controller: bool,
        every: bool,
    },
    /// The child's controller reference names (by uid) an owner of this group and kind whose
    /// own controller reference names (by uid) an `ancestor_kind` being deleted: a leaf two hops
    /// below a terminating CFApp (a BuildWorkload under its CFBuild, an AppWorkload under its
    /// CFProcess), deleted before the garbage collector's walk reaches it. The fence sees the
    /// first hop only.
    GrandOwnerTerminating {
        group: &'static str,
        kind: &'static str,
        ancestor_group: &'static str,
        ancestor_kind: &'static str,
    },
    /// The child's namespace is being deleted.
    NamespaceTerminating,
}

/// A CFApp being deleted: its kpack Image, when the Image's ownerReference names the CFApp
/// (stamp-owners adds it at admission).
pub const APP_IMAGE: Deletable = Deletable {
    group: kpack::GROUP,
    version: kpack::VERSION,
    kind: kpack::IMAGE,
    resource: "images",
    label: None,
    condition: Condition::OwnerTerminating {
        group: korifi::GROUP,
        kind: korifi::CF_APP,
        controller: false,
        every: false,
    },
    grace_period_seconds: None,
    opt_in: None,
};

/// The app's last BuildWorkload being deleted: its kpack Image, when every BuildWorkload the
/// Image's ownerReferences name (Korifi adds one per BuildWorkload) is being deleted or gone.
pub const WORKLOAD_IMAGE: Deletable = Deletable {
    condition: Condition::OwnerTerminating {
        group: korifi::GROUP,
        kind: korifi::BUILD_WORKLOAD,
        controller: false,
        every: true,
    },
    ..APP_IMAGE
};

/// A namespace being deleted: the kpack Images in it (the namespace controller deletes them
/// anyway, later).
pub const NAMESPACE_IMAGE: Deletable = Deletable {
    condition: Condition::NamespaceTerminating,
    ..APP_IMAGE
};

/// A kpack Build being deleted: its build pods, without a grace period, when the Build is the
/// pod's controller (kpack makes it so); the `kpack.io/build` label only finds them.
pub const BUILD_POD: Deletable = Deletable {
    group: "",
    version: "v1",
    kind: "Pod",
    resource: "pods",
    label: Some(kpack::BUILD_POD_LABEL),
    condition: Condition::OwnerTerminating {
        group: kpack::GROUP,
        kind: kpack::BUILD,
        controller: true,
        every: false,
    },
    grace_period_seconds: Some(0),
    opt_in: None,
};

/// An org namespace being deleted: the Korifi CFSpaces in it, at once instead of at the
/// namespace controller's first pass. Opt-in: `--delete-org-spaces`.
pub const NAMESPACE_SPACE: Deletable = Deletable {
    group: korifi::GROUP,
    version: korifi::VERSION,
    kind: korifi::CF_SPACE,
    resource: "cfspaces",
    label: None,
    condition: Condition::NamespaceTerminating,
    grace_period_seconds: None,
    opt_in: Some("--delete-org-spaces"),
};

/// A CFApp being deleted: its CFPackages (Korifi's finalizer deletes the package's image), when
/// the CFApp is their controller, at once instead of when the garbage collector gets to them.
pub const APP_PACKAGE: Deletable = Deletable {
    group: korifi::GROUP,
    version: korifi::VERSION,
    kind: korifi::CF_PACKAGE,
    resource: "cfpackages",
    label: Some(korifi::APP_GUID_LABEL),
    condition: Condition::OwnerTerminating {
        group: korifi::GROUP,
        kind: korifi::CF_APP,
        controller: true,
        every: false,
    },
    grace_period_seconds: None,
    opt_in: None,
};

/// A CFApp being deleted: the CFBuilds it controls (no finalizer of their own), at once, so that
/// none is left to re-create its BuildWorkload and the garbage collector's hop-by-hop walk of the
/// CFApp's foreground deletion is not the critical path.
pub const APP_BUILD: Deletable = Deletable {
    kind: korifi::CF_BUILD,
    resource: "cfbuilds",
    ..APP_PACKAGE
};

/// A CFApp being deleted: the CFProcesses it controls, at once (a live CFProcess re-creates an
/// AppWorkload deleted under it: measured on the real stack).
pub const APP_PROCESS: Deletable = Deletable {
    kind: korifi::CF_PROCESS,
    resource: "cfprocesses",
    ..APP_PACKAGE
};

/// A CFApp being deleted: the BuildWorkloads of its CFBuilds (their finalizer deletes the kpack
/// Builds), when the chain of controller references names the CFApp's uid — deleted right after
/// their CFBuild instead of when the garbage collector gets to them.
pub const APP_BUILD_WORKLOAD: Deletable = Deletable {
    kind: korifi::BUILD_WORKLOAD,
    resource: "buildworkloads",
    condition: Condition::GrandOwnerTerminating {
        group: korifi::GROUP,
        kind: korifi::CF_BUILD,
        ancestor_group: korifi::GROUP,
        ancestor_kind: korifi::CF_APP,
    },
    ..APP_PACKAGE
};

/// A CFApp being deleted: the AppWorkloads of its CFProcesses (their finalizer deletes the
/// StatefulSets, whose pods then start their grace period), when the chain of controller
/// references names the CFApp's uid. The app pods' grace period is theirs: nothing cuts it.
pub const APP_WORKLOAD: Deletable = Deletable {
    kind: korifi::APP_WORKLOAD,
    resource: "appworkloads",
    condition: Condition::GrandOwnerTerminating {
        group: korifi::GROUP,
        kind: korifi::CF_PROCESS,
        ancestor_group: korifi::GROUP,
        ancestor_kind: korifi::CF_APP,
    },
    ..APP_PACKAGE
};

/// Everything the fast finalizer may delete.
pub const DELETABLE: &[Deletable] = &[
    APP_IMAGE,
    WORKLOAD_IMAGE,
    NAMESPACE_IMAGE,
    BUILD_POD,
    APP_PACKAGE,
    APP_BUILD,
    APP_PROCESS,
    APP_BUILD_WORKLOAD,
    APP_WORKLOAD,
    NAMESPACE_SPACE,
];

/// An owner as the finalizer observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed<'a> {
    pub uid: &'a str,
    pub terminating: bool,
}

/// Whether `rule` permits deleting `child`, given the observed `owners` of the rule's owner kind
/// (an owner the child references but that is not among them is gone) and whether the child's
/// namespace is being deleted. For a [`Condition::GrandOwnerTerminating`] row the owners are the
/// intermediate ones, observed through [`through`].
pub fn permits(
    rule: &Deletable,
    child: &ObjectMeta,
    owners: &[Observed<'_>],
    namespace_terminating: bool,
) -> bool {
    match rule.condition {
        Condition::NamespaceTerminating => namespace_terminating,
        Condition::OwnerTerminating {
            group,
            kind,
            controller,
            every,
        } => owner_terminating(child, (group, kind), controller, every, owners),
        Condition::GrandOwnerTerminating { group, kind, .. } => {
            owner_terminating(child, (group, kind), true, false, owners)
        }
    }
}

/// For a [`Condition::GrandOwnerTerminating`] row: the intermediate owner `parent` (uid
/// `parent_uid`) as [`permits`] takes it — "terminating" when its controller reference names
/// (by uid) one of the observed `ancestors` of the row's ancestor kind that is being deleted.
/// Any other row: never terminating.
pub fn through<'a>(
    rule: &Deletable,
    parent_uid: &'a str,
    parent: &ObjectMeta,
    ancestors: &[Observed<'_>],
) -> Observed<'a> {
    let terminating = match rule.condition {
        Condition::GrandOwnerTerminating {
            ancestor_group,
            ancestor_kind,
            ..
        } => owner_terminating(parent, (ancestor_group, ancestor_kind), true, false, ancestors),
        _ => false,
    };
    Observed {
        uid: parent_uid,
        terminating,
    }
}

/// Whether an ownerReference of `child` to `owner` (group, kind) — its controller reference if
/// `controller` — names an observed owner being deleted; with `every`, all its references to
/// that kind must name owners being deleted or gone.
fn owner_terminating(
    child: &ObjectMeta,
    (group, kind): (&str, &str),
    controller: bool,
    every: bool,
    owners: &[Observed<'_>],
) -> bool {
    let references: Vec<&str> = child
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.kind == kind && api_group(&r.api_version) == group)
        .filter(|r| !controller || r.controller == Some(true))
        .map(|r| r.uid.as_str())
        .collect();
    let observed = |uid: &str| owners.iter().find(|o| o.uid == uid);
    let any = references
        .iter()
        .any(|uid| observed(uid).is_some_and(|o| o.terminating));
    any && (!every
        || references
            .iter()
            .all(|uid| observed(uid).is_none_or(|o| o.terminating)))
}

/// The group of an `apiVersion` (`""` for core's `v1`).
fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn owned_by(references: &[(&str, &str, &str, bool)]) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(
                references
                    .iter()
                    .map(|(api_version, kind, uid, controller)| OwnerReference {
                        api_version: (*api_version).into(),
                        kind: (*kind).into(),
                        name: "owner".into(),
                        uid: (*uid).into(),
                        controller: Some(*controller),
                        block_owner_deletion: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    const BUILD: &str = "kpack.io/v1alpha2";
    const KORIFI: &str = "korifi.cloudfoundry.org/v1alpha1";

    /// Issue 15, item 3: a pod that only carries `kpack.io/build=<build>` (any user can label a
    /// pod so) was force-deleted when that Build terminated.
    #[test]
    fn a_build_pod_is_force_deleted_only_when_its_controlling_build_terminates() {
        let terminating = [Observed {
            uid: "build-1",
            terminating: true,
        }];
        let labelled_only = ObjectMeta::default();
        assert!(!permits(&BUILD_POD, &labelled_only, &terminating, false));
        let other_build = owned_by(&[(BUILD, "Build", "build-2", true)]);
        assert!(!permits(&BUILD_POD, &other_build, &terminating, false));
        let not_controller = owned_by(&[(BUILD, "Build", "build-1", false)]);
        assert!(!permits(&BUILD_POD, &not_controller, &terminating, false));
        let kpacks = owned_by(&[(BUILD, "Build", "build-1", true)]);
        assert!(permits(&BUILD_POD, &kpacks, &terminating, false));
        let live = [Observed {
            uid: "build-1",
            terminating: false,
        }];
        assert!(!permits(&BUILD_POD, &kpacks, &live, false));
        // Same uid, another kind or group: not the Build.
        let impostor = owned_by(&[("example.com/v1", "Build", "build-1", true)]);
        assert!(!permits(&BUILD_POD, &impostor, &terminating, false));
    }

    /// An Image merely named like a deleted app was deleted.
    #[test]
    fn an_image_is_deleted_for_its_app_only_when_it_names_the_apps_uid() {
        let app = [Observed {
            uid: "app-1",
            terminating: true,
        }];
        assert!(!permits(&APP_IMAGE, &ObjectMeta::default(), &app, false));
        assert!(!permits(
            &APP_IMAGE,
            &owned_by(&[(KORIFI, "CFApp", "app-2", false)]),
            &app,
            false
        ));
        assert!(permits(
            &APP_IMAGE,
            &owned_by(&[(KORIFI, "CFApp", "app-1", false)]),
            &app,
            false
        ));
    }

    #[test]
    fn an_image_goes_with_its_build_workloads_only_when_every_one_is_going() {
        let image = owned_by(&[
            (KORIFI, "BuildWorkload", "bw-1", false),
            (KORIFI, "BuildWorkload", "bw-2", false),
        ]);
        let observed = |second: bool| {
            [
                Observed {
                    uid: "bw-1",
                    terminating: true,
                },
                Observed {
                    uid: "bw-2",
                    terminating: second,
                },
            ]
        };
        assert!(!permits(&WORKLOAD_IMAGE, &image, &observed(false), false));
        assert!(permits(&WORKLOAD_IMAGE, &image, &observed(true), false));
        // bw-2 is gone: only bw-1 is observed.
        assert!(permits(&WORKLOAD_IMAGE, &image, &observed(true)[..1], false));
        // None of the observed workloads owns it.
        assert!(!permits(
            &WORKLOAD_IMAGE,
            &ObjectMeta::default(),
            &observed(true),
            false
        ));
    }

    /// The CFApp is the controller of its CFPackages, CFBuilds and CFProcesses; a plain
    /// reference, or another app's, is not enough.
    #[test]
    fn the_apps_children_go_with_the_app_that_controls_them() {
        let app = [Observed {
            uid: "app-1",
            terminating: true,
        }];
        let controlled = owned_by(&[(KORIFI, "CFApp", "app-1", true)]);
        let plain = owned_by(&[(KORIFI, "CFApp", "app-1", false)]);
        let other = owned_by(&[(KORIFI, "CFApp", "app-2", true)]);
        let live = [Observed {
            uid: "app-1",
            terminating: false,
        }];
        for rule in [APP_PACKAGE, APP_BUILD, APP_PROCESS] {
            assert!(permits(&rule, &controlled, &app, false), "{}", rule.kind);
            assert!(!permits(&rule, &plain, &app, false), "{}", rule.kind);
            assert!(!permits(&rule, &other, &app, false), "{}", rule.kind);
            assert!(!permits(&rule, &controlled, &live, false), "{}", rule.kind);
        }
    }

    /// A leaf two hops down goes only when both controller references chain to the terminating
    /// app's uid: a BuildWorkload of another app's CFBuild, or of a CFBuild the app does not
    /// control, stays.
    #[test]
    fn a_leaf_goes_only_when_its_controller_chain_names_the_terminating_app() {
        let app = [Observed {
            uid: "app-1",
            terminating: true,
        }];
        let workload = owned_by(&[(KORIFI, "CFBuild", "build-1", true)]);
        for (rule, parent_kind) in [(APP_BUILD_WORKLOAD, "CFBuild"), (APP_WORKLOAD, "CFProcess")] {
            let child = owned_by(&[(KORIFI, parent_kind, "build-1", true)]);
            let parent = owned_by(&[(KORIFI, "CFApp", "app-1", true)]);
            let observed = [through(&rule, "build-1", &parent, &app)];
            assert!(permits(&rule, &child, &observed, false), "{}", rule.kind);
            // The parent is another app's, or only references this one.
            for parent in [
                owned_by(&[(KORIFI, "CFApp", "app-2", true)]),
                owned_by(&[(KORIFI, "CFApp", "app-1", false)]),
                ObjectMeta::default(),
            ] {
                let observed = [through(&rule, "build-1", &parent, &app)];
                assert!(!permits(&rule, &child, &observed, false), "{}", rule.kind);
            }
            // The child names another parent, or not as its controller.
            let parent = owned_by(&[(KORIFI, "CFApp", "app-1", true)]);
            let observed = [through(&rule, "build-1", &parent, &app)];
            for child in [
                owned_by(&[(KORIFI, parent_kind, "build-2", true)]),
                owned_by(&[(KORIFI, parent_kind, "build-1", false)]),
            ] {
                assert!(!permits(&rule, &child, &observed, false), "{}", rule.kind);
            }
        }
        // The kinds must match the row: a CFBuild is no CFProcess.
        let parent = owned_by(&[(KORIFI, "CFApp", "app-1", true)]);
        let observed = [through(&APP_WORKLOAD, "build-1", &parent, &app)];
        assert!(!permits(&APP_WORKLOAD, &workload, &observed, false));
        // `through` never makes an owner of another row terminating.
        assert!(!through(&APP_IMAGE, "build-1", &parent, &app).terminating);
    }

    #[test]
    fn namespace_deletions_need_the_namespace_terminating() {
        for rule in [NAMESPACE_IMAGE, NAMESPACE_SPACE] {
            assert!(!permits(&rule, &ObjectMeta::default(), &[], false));
            assert!(permits(&rule, &ObjectMeta::default(), &[], true));
        }
    }

    #[test]
    fn only_space_deletion_is_opt_in() {
        let opt_in: Vec<&str> = DELETABLE.iter().filter_map(|d| d.opt_in).collect();
        assert_eq!(opt_in, ["--delete-org-spaces"]);
    }
}
