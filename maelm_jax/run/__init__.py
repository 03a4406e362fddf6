"""A run's lifecycle: the train loop, its step, checkpoints, preemption, memory, processes, metrics, config resolution."""
