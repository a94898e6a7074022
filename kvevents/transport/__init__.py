"""ZeroMQ transport helpers shared by the publisher and the subscriber (SPEC sections 7-8)."""
