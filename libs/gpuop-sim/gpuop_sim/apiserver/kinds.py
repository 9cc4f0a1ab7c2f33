"""The built-in resource types of the simulated API server and their registry rules.

Each constant is a :class:`~gpuop_sim.apiserver.resources.ResourceType` carrying what the matching
upstream strategy does: what a create resets (a new pod is ``Pending``, a new
PodDisruptionBudget has no status), the defaults and timestamp forms applied to every write,
and the kind's validation. ``server.py`` registers :data:`BUILTIN` in the catalog; in-process
components (the simulated kubelet, controllers) name the types they write, e.g.
``registry.mutate(kinds.PODS, ...)``.
"""

from __future__ import annotations

from typing import Any

from gpuop_sim.apiserver import schemas, validation
from gpuop_sim.apiserver.dra_kinds import DRA_KINDS
from gpuop_sim.apiserver.errors import FieldError, RawValue
from gpuop_sim.apiserver.resources import ResourceType
from gpuop_sim.apiserver.timestamps import normalize_times

Obj = dict[str, Any]


def _clear_status(obj: Obj) -> None:
    obj.pop("status", None)


def _namespace_create(obj: Obj) -> None:
    obj["spec"] = {"finalizers": ["kubernetes"]}
    obj["status"] = {"phase": "Active"}


def _namespace_normalize(obj: Obj) -> None:
    # Since 1.21 every namespace carries its own name as a label, for selectors.
    labels = obj["metadata"].setdefault("labels", {})
    labels["kubernetes.io/metadata.name"] = obj["metadata"].get("name", "")


def _node_normalize(obj: Obj) -> None:
    normalize_times(obj, "Node")
    # NodeCondition's times have no omitempty: a real server answers null for one not sent.
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict):
            condition.setdefault("lastHeartbeatTime", None)
            condition.setdefault("lastTransitionTime", None)


def _node_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    # kube-apiserver's ValidateNode checks the taints under the path `metadata.taints`, not
    # `spec.taints` (its field path starts at metadata); clients see that path in the causes.
    return validation.validate_taints(
        (new.get("spec") or {}).get("taints") or [], "metadata.taints"
    )


_QOS_RESOURCES = ("cpu", "memory")


def _qos_class(spec: Obj) -> str:
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    resources = [container.get("resources") or {} for container in containers]
    if not any(
        name in (r.get("requests") or {}) or name in (r.get("limits") or {})
        for r in resources
        for name in _QOS_RESOURCES
    ):
        return "BestEffort"
    for r in resources:
        limits = r.get("limits") or {}
        requests = r.get("requests") or limits
        for name in _QOS_RESOURCES:
            if name not in limits or requests.get(name) != limits[name]:
                return "Burstable"
    return "Guaranteed"


def _pod_create(obj: Obj) -> None:
    obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj.get("spec") or {})}


def _pod_normalize(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or []:
            image = container.get("image", "")
            latest = ":" not in image.rpartition("/")[2] or image.endswith(":latest")
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
    normalize_times(obj, "Pod")


_POD_MUTABLE = (
    "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
    "`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def _without_mutable(spec: Obj) -> Obj:
    masked = {k: v for k, v in spec.items() if k not in ("activeDeadlineSeconds", "tolerations")}
    for group in ("containers", "initContainers"):
        if group in masked:
            masked[group] = [{**c, "image": ""} for c in masked[group]]
    return masked


def _pod_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    found: list[FieldError] = []
    containers = spec.get("containers") or []
    if not containers:
        found.append(FieldError.required("spec.containers", ""))
    for index, container in enumerate(containers):
        if not container.get("name"):
            found.append(FieldError.required(f"spec.containers[{index}].name", ""))
        if not container.get("image"):
            found.append(FieldError.required(f"spec.containers[{index}].image", ""))
    if old is not None:
        old_spec = old.get("spec") or {}
        if _without_mutable(spec) != _without_mutable(old_spec):
            found.append(
                FieldError.forbidden(
                    "spec", f"pod updates may not change fields other than {_POD_MUTABLE}"
                )
            )
    return found


def _pdb_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    found: list[FieldError] = []
    if "minAvailable" in spec and "maxUnavailable" in spec:
        found.append(
            FieldError.invalid(
                "spec",
                RawValue(f"policy.PodDisruptionBudgetSpec{spec}"),
                "minAvailable and maxUnavailable cannot be both set",
            )
        )
    for field in ("minAvailable", "maxUnavailable"):
        if field in spec:
            found += validation.int_or_percent_errors(f"spec.{field}", spec[field])
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in ("IfHealthyBudget", "AlwaysAllow"):
        found.append(
            FieldError.not_supported(
                "spec.unhealthyPodEvictionPolicy", policy, ("AlwaysAllow", "IfHealthyBudget")
            )
        )
    return found


def _lease_normalize(obj: Obj) -> None:
    normalize_times(obj, "Lease")


def _lease_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    found: list[FieldError] = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        found.append(
            FieldError.invalid("spec.leaseDurationSeconds", duration, "must be greater than 0")
        )
    transitions = spec.get("leaseTransitions")
    if transitions is not None and transitions < 0:
        found.append(
            FieldError.invalid(
                "spec.leaseTransitions", transitions, "must be greater than or equal to 0"
            )
        )
    return found


def _resourceclaim_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    # A claim's spec is immutable (only its status, through the subresource, changes: the
    # scheduler writes the allocation there).
    if old is not None and (new.get("spec") or {}) != (old.get("spec") or {}):
        return [FieldError.invalid("spec", new.get("spec"), "field is immutable")]
    return []


def _crd_create(obj: Obj) -> None:
    obj.pop("status", None)
    # The CRD controller removes this finalizer once every custom object is gone.
    finalizers = obj["metadata"].setdefault("finalizers", [])
    if schemas.CLEANUP_FINALIZER not in finalizers:
        finalizers.append(schemas.CLEANUP_FINALIZER)


def _event_normalize(obj: Obj) -> None:
    normalize_times(obj, "Event")


def _daemonset_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    selector = spec.get("selector")
    found: list[FieldError] = []
    if not selector:
        found.append(FieldError.required("spec.selector", ""))
    else:
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        wanted = selector.get("matchLabels") or {}
        if any(labels.get(key) != value for key, value in wanted.items()):
            found.append(
                FieldError.invalid(
                    "spec.template.metadata.labels",
                    labels,
                    "`selector` does not match template `labels`",
                )
            )
    if old is not None and selector != (old.get("spec") or {}).get("selector"):
        found.append(FieldError.invalid("spec.selector", selector, "field is immutable"))
    return found


NAMESPACES = ResourceType(
    "",
    "v1",
    "Namespace",
    "namespaces",
    "namespace",
    namespaced=False,
    description="Namespace provides a scope for Names. Use of multiple namespaces is optional.",
    short_names=("ns",),
    subresources=frozenset({"status"}),
    prepare_create=_namespace_create,
    normalize=_namespace_normalize,
)
NODES = ResourceType(
    "",
    "v1",
    "Node",
    "nodes",
    "node",
    namespaced=False,
    description=(
        "Node is a worker node in Kubernetes. Each node will have a unique identifier in the "
        "cache (i.e. in etcd)."
    ),
    short_names=("no",),
    subresources=frozenset({"status"}),
    normalize=_node_normalize,
    validate=_node_validate,
    field_labels=("spec.unschedulable",),
)
PODS = ResourceType(
    "",
    "v1",
    "Pod",
    "pods",
    "pod",
    namespaced=True,
    description=(
        "Pod is a collection of containers that can run on a host. This resource is created by "
        "clients and scheduled onto hosts."
    ),
    short_names=("po",),
    categories=("all",),
    subresources=frozenset({"status", "eviction"}),
    return_deleted_object=True,
    prepare_create=_pod_create,
    normalize=_pod_normalize,
    validate=_pod_validate,
    field_labels=(
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
)
EVENTS = ResourceType(
    "",
    "v1",
    "Event",
    "events",
    "event",
    namespaced=True,
    description="Event is a report of an event somewhere in the cluster.",
    short_names=("ev",),
    normalize=_event_normalize,
    field_labels=(
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
)
CONFIGMAPS = ResourceType(
    "",
    "v1",
    "ConfigMap",
    "configmaps",
    "configmap",
    namespaced=True,
    short_names=("cm",),
    description="ConfigMap holds configuration data for pods to consume.",
)
PODDISRUPTIONBUDGETS = ResourceType(
    "policy",
    "v1",
    "PodDisruptionBudget",
    "poddisruptionbudgets",
    "poddisruptionbudget",
    namespaced=True,
    description=(
        "PodDisruptionBudget is an object to define the max disruption that can be caused to "
        "a collection of pods"
    ),
    short_names=("pdb",),
    subresources=frozenset({"status"}),
    prepare_create=_clear_status,
    validate=_pdb_validate,
)
LEASES = ResourceType(
    "coordination.k8s.io",
    "v1",
    "Lease",
    "leases",
    "lease",
    namespaced=True,
    description="Lease defines a lease concept.",
    normalize=_lease_normalize,
    validate=_lease_validate,
)
DAEMONSETS = ResourceType(
    "apps",
    "v1",
    "DaemonSet",
    "daemonsets",
    "daemonset",
    namespaced=True,
    description="DaemonSet represents the configuration of a daemon set.",
    short_names=("ds",),
    categories=("all",),
    subresources=frozenset({"status"}),
    prepare_create=_clear_status,
    validate=_daemonset_validate,
)
RESOURCECLAIMS = ResourceType(
    "resource.k8s.io",
    "v1",
    "ResourceClaim",
    "resourceclaims",
    "resourceclaim",
    namespaced=True,
    description=(
        "ResourceClaim describes a request for access to resources in the cluster, for use by "
        "workloads."
    ),
    subresources=frozenset({"status"}),
    prepare_create=_clear_status,
    validate=_resourceclaim_validate,
)
"""Dynamic Resource Allocation's claims (GA in Kubernetes 1.34): a pod's devices, allocated
by a DRA driver (`status.allocation.devices.results[].driver`). Tests seed them allocated,
as the scheduler would leave them; nothing here allocates."""
CUSTOMRESOURCEDEFINITIONS = ResourceType(
    "apiextensions.k8s.io",
    "v1",
    "CustomResourceDefinition",
    "customresourcedefinitions",
    "customresourcedefinition",
    namespaced=False,
    description=(
        "CustomResourceDefinition represents a resource that should be exposed on the API "
        "server. Its name MUST be in the format <.spec.name>.<.spec.group>."
    ),
    short_names=("crd", "crds"),
    categories=("api-extensions",),
    subresources=frozenset({"status"}),
    prepare_create=_crd_create,
    validate=schemas.validate_crd,
)


def _review(
    kind: str,
    *,
    group: str = "authorization.k8s.io",
    namespaced: bool = False,
    description: str,
) -> ResourceType:
    """A review: created, answered, never stored (``reviews.py``)."""
    return ResourceType(
        group,
        "v1",
        kind,
        f"{kind.lower()}s",
        kind.lower(),
        namespaced=namespaced,
        strategic_merge=False,
        verbs=("create",),
        description=description,
        virtual=True,
    )


SELFSUBJECTACCESSREVIEWS = _review(
    "SelfSubjectAccessReview",
    description="SelfSubjectAccessReview checks whether the current user can perform an "
    'action. An empty spec.resourceAttributes.namespace means "in all namespaces".',
)
SUBJECTACCESSREVIEWS = _review(
    "SubjectAccessReview",
    description="SubjectAccessReview checks whether or not a user or group can perform an action.",
)
LOCALSUBJECTACCESSREVIEWS = _review(
    "LocalSubjectAccessReview",
    namespaced=True,
    description="LocalSubjectAccessReview checks whether or not a user or group can perform an "
    "action in a given namespace.",
)
SELFSUBJECTRULESREVIEWS = _review(
    "SelfSubjectRulesReview",
    description="SelfSubjectRulesReview enumerates the set of actions the current user can "
    "perform within a namespace.",
)
SELFSUBJECTREVIEWS = _review(
    "SelfSubjectReview",
    group="authentication.k8s.io",
    description="SelfSubjectReview contains the user information that the kube-apiserver has "
    "about the user making this request.",
)
REVIEWS = (
    SELFSUBJECTREVIEWS,
    LOCALSUBJECTACCESSREVIEWS,
    SELFSUBJECTACCESSREVIEWS,
    SELFSUBJECTRULESREVIEWS,
    SUBJECTACCESSREVIEWS,
)

BUILTIN = (
    NAMESPACES,
    NODES,
    PODS,
    EVENTS,
    CONFIGMAPS,
    PODDISRUPTIONBUDGETS,
    LEASES,
    DAEMONSETS,
    RESOURCECLAIMS,
    *DRA_KINDS,
    CUSTOMRESOURCEDEFINITIONS,
    *REVIEWS,
)
"""Every built-in type, in the order discovery lists them."""
