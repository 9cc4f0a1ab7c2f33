"""What the test suites share, so that no test module imports another:

processes  the `gpuop` command, `gpuop run` services, the processes they start
waiting    `eventually`: the one way a test waits for something to come true
stack      the end-to-end stack: nats-server, a simulated cluster, every agent process
invariants what every recorded rollout must satisfy
rollouts   the e2e rollout's policy, its done check, the parsed log, the CRD
hosts      host roots written by hand
locks      the dependency locks under requirements/
"""
