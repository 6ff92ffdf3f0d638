"""Front door over ZeroMQ: the versioned message protocol, the server and the client."""
