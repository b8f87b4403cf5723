"""A real node (containerd, runc, CNI, kubelet, kube-proxy, kube-scheduler) for the tests that
must run the product as a user does: its image, its chart, real containers."""
