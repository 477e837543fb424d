//! IDX reader and Fashion-MNIST.
