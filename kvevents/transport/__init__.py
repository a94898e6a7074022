"""ZeroMQ transport helpers shared by the publisher and the subscriber (schemas/README.md, "Transport in one page")."""
