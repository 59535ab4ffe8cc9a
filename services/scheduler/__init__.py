"""The scheduler room: queues, admission, batch formation, preemption, routing, deadlines."""
