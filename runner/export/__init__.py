"""A spec in another form: a KubeRay RayJob manifest, and the working_dir package Ray uploads."""
