"""The commands gpuop_sim adds to `gpuop` (entry point group `gpuop.commands`).

demo          `gpuop demo`: the whole stack on one machine, rolling a driver upgrade
processes     the demo's service processes: spawn, probe, stop, signals
rollout_view  following a rollout from its events    screens  the live terminal view
sim           `gpuop sim apiserver` and `gpuop sim host`
"""
