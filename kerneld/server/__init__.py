"""The kerneld daemon: gRPC services on unix sockets over the store."""
