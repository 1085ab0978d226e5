"""Where the images come from: photo folders and shards, generated images, MNIST and CIFAR-10 arrays."""
