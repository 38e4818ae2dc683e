"""What the Fashion-MNIST examples (and kolo-bench scaling's Python workers)
share: the seed's Keras-style CNN and a reader for Debian's
dataset-fashion-mnist files (/usr/share/datasets/fashion-mnist)."""
import gzip
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """The seed's Keras CNN: Conv2D(32, 3x3, ReLU) -> Conv2D(64, 3x3, ReLU) ->
    MaxPool(2x2) -> Dropout(0.25) -> Flatten -> Dense(128, ReLU) -> Dropout(0.5)
    -> Dense(10). 1.2 M parameters, the model of examples/fashion_mnist/model.h."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(64 * 12 * 12, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):  # (B, 1, 28, 28) in [0, 1]
        x = F.relu(self.conv1(x))  # (B, 32, 26, 26)
        x = F.relu(self.conv2(x))  # (B, 64, 24, 24)
        x = F.max_pool2d(x, 2)  # (B, 64, 12, 12)
        x = F.dropout(x, 0.25, self.training)
        x = torch.flatten(x, 1)  # (B, 9216)
        x = F.relu(self.fc1(x))  # (B, 128)
        x = F.dropout(x, 0.5, self.training)
        return self.fc2(x)  # (B, 10) logits


def read_idx(path, dims):
    """An IDX file (MNIST's format, gzipped) as a uint8 tensor of its shape."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SystemExit(f"cannot read {path}: {e} (apt-get install dataset-fashion-mnist, or "
                         "pass --data-dir)")
    magic = 0x800 + dims  # unsigned bytes, `dims` dimensions
    header = struct.unpack(">" + "I" * (1 + dims), data[:4 * (1 + dims)])
    if header[0] != magic:
        raise SystemExit(f"{path}: bad magic {header[0]:#x}, expected {magic:#x}")
    body = torch.frombuffer(bytearray(data[4 * (1 + dims):]), dtype=torch.uint8)
    return body.reshape(header[1:])


def fashion_mnist_uint8(data_dir, split):
    """(images (N, 1, 28, 28) uint8, labels (N) int64) of split 'train' or 't10k'."""
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"), 3)
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"), 1)
    return images.unsqueeze(1), labels.long()


def fashion_mnist(data_dir, split, subset=0):
    """A dataset of split 'train' or 't10k': images as float (1, 28, 28) in [0, 1],
    and labels; the first `subset` of them (0 = all)."""
    images, labels = fashion_mnist_uint8(data_dir, split)
    if subset:
        images, labels = images[:subset], labels[:subset]
    return torch.utils.data.TensorDataset(images.float().div_(255), labels)
