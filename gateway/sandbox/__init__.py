"""Running untrusted code for code rewards: the sandbox backends (local bubblewrap, a
remote Sandbox Fusion service) and the runner that bounds them per rule."""
