//! Pure logic of kube-discovery: objects in, nodes out. No I/O in this crate.
