"""GPU health remediation, the second saga kind (issue 21), on the machinery of
`gpuop.saga.machine`.

A GPU that telemetry reports unhealthy with an action of `reset-gpu` or worse
(`DeviceHealthChanged.action`, from the XID catalog) starts a remediation of its node, unless
one runs there; the circuit breaker (`breaker`, `remediation.maxPerHour`) may refuse it. The
node is quarantined (`GPUHealthy` False, the taint when the policy quarantines, an Event),
waits for a slot of the one `maxUnavailable` budget it shares with upgrades, then:

    gpu-holders-required -> gpu-pods-eviction-required (only the pods holding the GPUs)
    -> operands-pause-required -> gpu-reset-required (-> reboot-required when the reset
    fails and reboots are allowed, confirmed by a new boot id) -> validation-required (the
    upgrade's ladder) -> release-required (operands resumed, condition True, untainted,
    each confirmed) -> remediation-done

and any failure ends in remediation-failed (tainted, condition False with the reason). A
node whose upgrade still has its driver reload ahead (`UpgradeState.remediation_folds_in`)
is not touched twice: the remediation folds into the upgrade (folded-into-upgrade) and ends
with it (its release through release-required).

On a node serving its GPUs through DRA (`RemediationStarted.dra_devices`, from the node's
latest `device.api-applied`), the quarantine is of the faulty GPUs' devices, not the node:
a `DeviceTaintRule` (`NoSchedule`) per device, so no new claim is allocated them while the
node's other GPUs keep serving; the holders named include the pods of the ResourceClaims on
those GPUs, evicted through the Eviction API (PDBs respected); the release deletes the
rules (`quarantined_devices`: exactly those it made), and a failure leaves them, as it
leaves the node's taint.

    records   RemediationSaga (the KV record), Step, start (from RemediationStarted)
    table     TABLE
    phases    one module per state (enter, on_event, on_deadline, effects), PHASES
    drafting  the Draft its phases share, the Kubernetes Events of its moves
    actions   MirrorHealth (condition and taint), EvictPods (named pods)
    kind      REMEDIATION and the fold: is_inbound, step, outputs, pending
    breaker   the sliding hour
"""
