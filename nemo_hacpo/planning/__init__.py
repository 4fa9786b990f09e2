"""Planning a run before anything starts: functions of the config and the agents' architectures, no Ray.

    plan.py         `--plan` and the driver's start-up check: GPU memory per phase on each agent's busiest GPU,
                    host RAM per node, the checkpoint's size and hashing time, `gpu_memory_utilization: auto`
    gpu_memory.py   the GPU terms and their constants, each with the measurement or source it comes from
    host_memory.py  the host side: processes, pinned copies, the checkpoint save
    preflight.py    checks of the files a config points at (tokenizers, checkpoint configs)
    cuda_driver.py  the NVIDIA driver the container's CUDA needs
"""
