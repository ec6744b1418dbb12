"""
reference_models.py - the PyTorch definitions ringtrain's C models are checked
against, with exactly the state_dict names the C side reads and writes, plus
the deterministic formulas (hash-initialised weights, fixture images) shared by
tools/dev/gen_fixtures.py and tools/check_checkpoint.py.

    build(name, in_channels, height, width, num_classes) -> nn.Module

Models (MODELS lists them; "wrn-D-K" is a family, parse_wrn() reads it):

  mnist-net   the PyTorch examples MNIST net, returning logits
  resnet18    torchvision.models.resnet18(num_classes=K); conv1 replaced by
              Conv2d(C, 64, 7, 2, 3, bias=False) when C != 3
  resnet50    torchvision.models.resnet50(num_classes=K) (Bottleneck, stride
              on the 3x3 convolution), conv1 replaced the same way
  resnet9     the DAWNBench ResNet-9 (Myrtle.ai / David Page), logits * 0.125
  wrn-D-K     WideResNet-D-K as in xternalz/WideResNet-pytorch, dropRate 0

Needs torch and torchvision (Debian: python3-torch, python3-torchvision).
"""

import math
import re

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("mnist-net", "resnet18", "resnet50", "resnet9", "wrn-D-K")

# ---------------------------------------------------------------- mnist-net


class MnistNet(nn.Module):
    """pytorch/examples mnist/main.py Net, without the final log_softmax."""

    def __init__(self, in_channels, height, width, num_classes):
        super().__init__()
        fh, fw = (height - 4) // 2, (width - 4) // 2
        if fh < 1 or fw < 1:
            raise ValueError(
                "mnist-net: input %dx%d is too small: conv1, conv2 (3x3, no padding) and "
                "max_pool2d(2) need at least 6x6" % (height, width))
        self.conv1 = nn.Conv2d(in_channels, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(64 * fh * fw, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return self.fc2(x)


# ---------------------------------------------------------------- resnet18, resnet50


def _torchvision_resnet(name, in_channels, num_classes):
    import torchvision
    m = getattr(torchvision.models, name)(num_classes=num_classes)
    if in_channels != 3:
        m.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(m.conv1.weight, mode="fan_out", nonlinearity="relu")
    # Every stage has padding and ends in adaptive average pooling, so any
    # input of at least 1x1 gives a 1x1 map before fc: nothing is too small.
    return m


def _resnet18(in_channels, height, width, num_classes):
    return _torchvision_resnet("resnet18", in_channels, num_classes)


def _resnet50(in_channels, height, width, num_classes):
    return _torchvision_resnet("resnet50", in_channels, num_classes)


# ---------------------------------------------------------------- resnet9


def _conv_bn(ci, co):
    return nn.Sequential(nn.Conv2d(ci, co, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(co),
                         nn.ReLU())


class ResNet9(nn.Module):
    """DAWNBench ResNet-9 (Myrtle.ai, David Page), logits scaled by 0.125."""

    def __init__(self, in_channels, height, width, num_classes):
        super().__init__()
        if height < 8 or width < 8:
            raise ValueError(
                "resnet9: input %dx%d is too small: layer1, layer2 and layer3 each halve it "
                "with MaxPool2d(2), so it must be at least 8x8" % (height, width))
        self.prep = _conv_bn(in_channels, 64)
        self.layer1 = nn.Sequential(_conv_bn(64, 128), nn.MaxPool2d(2))
        self.res1 = nn.Sequential(_conv_bn(128, 128), _conv_bn(128, 128))
        self.layer2 = nn.Sequential(_conv_bn(128, 256), nn.MaxPool2d(2))
        self.layer3 = nn.Sequential(_conv_bn(256, 512), nn.MaxPool2d(2))
        self.res3 = nn.Sequential(_conv_bn(512, 512), _conv_bn(512, 512))
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Linear(512, num_classes, bias=False)

    def forward(self, x):
        x = self.prep(x)
        x = self.layer1(x)
        x = x + self.res1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = x + self.res3(x)
        x = self.pool(x).flatten(1)
        return self.fc(x) * 0.125


# ---------------------------------------------------------------- wide resnet


class BasicBlock(nn.Module):
    """xternalz/WideResNet-pytorch BasicBlock (pre-activation), dropRate 0."""

    def __init__(self, in_planes, out_planes, stride):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_planes, out_planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.equalInOut = in_planes == out_planes
        self.convShortcut = (not self.equalInOut) and nn.Conv2d(
            in_planes, out_planes, kernel_size=1, stride=stride, padding=0, bias=False) or None

    def forward(self, x):
        if not self.equalInOut:
            x = self.relu1(self.bn1(x))
            out = x
        else:
            out = self.relu1(self.bn1(x))
        out = self.relu2(self.bn2(self.conv1(out if self.equalInOut else x)))
        out = self.conv2(out)
        return torch.add(x if self.equalInOut else self.convShortcut(x), out)


class NetworkBlock(nn.Module):
    def __init__(self, nb_layers, in_planes, out_planes, stride):
        super().__init__()
        self.layer = nn.Sequential(*[
            BasicBlock(in_planes if i == 0 else out_planes, out_planes, stride if i == 0 else 1)
            for i in range(nb_layers)
        ])

    def forward(self, x):
        return self.layer(x)


class WideResNet(nn.Module):
    def __init__(self, depth, widen_factor, in_channels, num_classes):
        super().__init__()
        ch = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        n = (depth - 4) // 6
        self.conv1 = nn.Conv2d(in_channels, ch[0], kernel_size=3, stride=1, padding=1, bias=False)
        self.block1 = NetworkBlock(n, ch[0], ch[1], 1)
        self.block2 = NetworkBlock(n, ch[1], ch[2], 2)
        self.block3 = NetworkBlock(n, ch[2], ch[3], 2)
        self.bn1 = nn.BatchNorm2d(ch[3])
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(ch[3], num_classes)
        self.nChannels = ch[3]
        # xternalz's initialisation
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
            elif isinstance(m, nn.Linear):
                m.bias.data.zero_()

    def forward(self, x):
        out = self.conv1(x)
        out = self.block1(out)
        out = self.block2(out)
        out = self.block3(out)
        out = self.relu(self.bn1(out))
        # xternalz: F.avg_pool2d(out, 8) at 32x32; adaptive to 1x1 is the same there
        out = F.adaptive_avg_pool2d(out, 1)
        out = out.flatten(1)
        return self.fc(out)


_WRN_RE = re.compile(r"^wrn-([0-9]+)-([0-9]+)$")


def parse_wrn(name):
    """'wrn-D-K' -> (D, K); ValueError if the name is not a valid WideResNet."""
    m = _WRN_RE.match(name)
    if not m:
        raise ValueError("%r is not a WideResNet name of the form wrn-D-K (e.g. wrn-16-4, wrn-28-10)" % name)
    depth, k = int(m.group(1)), int(m.group(2))
    if depth < 10 or (depth - 4) % 6 != 0:
        raise ValueError("%s: depth %d must be 6n+4 with n >= 1 (10, 16, 22, 28, 34, 40, ...)" % (name, depth))
    if k < 1:
        raise ValueError("%s: widen factor must be at least 1" % name)
    return depth, k


# ---------------------------------------------------------------- build


def build(name, in_channels, height, width, num_classes):
    """The reference nn.Module for `name` on (in_channels, height, width) inputs."""
    for what, v in (("in_channels", in_channels), ("height", height), ("width", width),
                    ("num_classes", num_classes)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError("%s: %s must be a positive integer, got %r" % (name, what, v))
    if num_classes < 2:
        raise ValueError("%s: num_classes must be at least 2, got %d" % (name, num_classes))
    if name == "mnist-net":
        return MnistNet(in_channels, height, width, num_classes)
    if name == "resnet18":
        return _resnet18(in_channels, height, width, num_classes)
    if name == "resnet50":
        return _resnet50(in_channels, height, width, num_classes)
    if name == "resnet9":
        return ResNet9(in_channels, height, width, num_classes)
    if name.startswith("wrn-"):
        depth, k = parse_wrn(name)
        return WideResNet(depth, k, in_channels, num_classes)
    raise ValueError("unknown model %r; the models are mnist-net, resnet18, resnet50, resnet9, wrn-D-K "
                     "(D = 6n+4, e.g. wrn-16-4, wrn-28-10)" % (name,))


# ---------------------------------------------------------------- formulas
#
# Shared with the C tests, which reproduce them exactly:
#
#   fnv1a32(bytes): h = 2166136261; for each byte b: h ^= b; h = h * 16777619 mod 2^32
#   fmix32(h):      h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16  (mod 2^32)
#   hash_u(name, i) = fmix32((fnv1a32(utf-8 name) + i * 0x9E3779B1) mod 2^32) / 2^32   (float64, in [0,1))
#   image byte j   = fmix32((j + 12345) mod 2^32) & 0xFF

M32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B1


def fnv1a32(data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    h = 2166136261
    for b in data:
        h ^= b
        h = (h * 16777619) & M32
    return h


def fmix32(h):
    """MurmurHash3's finaliser on a Python int or a numpy integer array (returns uint64 array then)."""
    if isinstance(h, np.ndarray):
        h = h.astype(np.uint64) & np.uint64(M32)
        h ^= h >> np.uint64(16)
        h = (h * np.uint64(0x85EBCA6B)) & np.uint64(M32)
        h ^= h >> np.uint64(13)
        h = (h * np.uint64(0xC2B2AE35)) & np.uint64(M32)
        h ^= h >> np.uint64(16)
        return h
    h &= M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    h ^= h >> 16
    return h


def hash_u(name, count):
    """float64 array u[i] = fmix32((fnv1a32(name) + i*0x9E3779B1) mod 2^32) / 2^32, i < count."""
    i = np.arange(count, dtype=np.uint64)
    x = (np.uint64(fnv1a32(name)) + i * np.uint64(GOLDEN)) & np.uint64(M32)
    return fmix32(x).astype(np.float64) / 4294967296.0


def fixture_images(n, c, h, w):
    """uint8 (n, c, h, w): element j (flat, C order) = fmix32((j + 12345) mod 2^32) & 0xFF."""
    j = np.arange(n * c * h * w, dtype=np.uint64) + np.uint64(12345)
    return (fmix32(j) & np.uint64(0xFF)).astype(np.uint8).reshape(n, c, h, w)


def tensor_roles(state_dict):
    """
    {name: role} for every state_dict entry, decided from names and shapes
    alone (the rule the C side uses):
      "weight"   ndim 4 or 2, name ends in ".weight"        (conv / linear)
      "bias"     ndim 1, "X.bias" where X has no X.running_mean (conv / linear bias)
      "bn_weight", "bn_bias"   ndim 1 "X.weight"/"X.bias" where X.running_mean exists
      "running_mean", "running_var", "num_batches_tracked"
    """
    roles = {}
    for name, t in state_dict.items():
        prefix, _, leaf = name.rpartition(".")
        is_bn = (prefix + ".running_mean") in state_dict
        if leaf == "weight" and t.dim() in (2, 4) and not is_bn:
            roles[name] = "weight"
        elif leaf == "weight" and t.dim() == 1 and is_bn:
            roles[name] = "bn_weight"
        elif leaf == "bias" and t.dim() == 1 and is_bn:
            roles[name] = "bn_bias"
        elif leaf == "bias" and t.dim() == 1 and (prefix + ".weight") in state_dict:
            roles[name] = "bias"
        elif leaf in ("running_mean", "running_var", "num_batches_tracked") and is_bn:
            roles[name] = leaf
        else:
            raise ValueError("no initialisation rule for %s %s" % (name, tuple(t.shape)))
    return roles


def fan_in(shape):
    return int(shape[1]) * int(np.prod(shape[2:], dtype=np.int64))


def formula_values(name, role, shape, weight_shape=None):
    """The formula value of state_dict tensor `name` as a float32 numpy array (int64 for num_batches_tracked)."""
    count = int(np.prod(shape, dtype=np.int64))
    if role == "num_batches_tracked":
        return np.zeros(shape, dtype=np.int64)
    u = hash_u(name, count)
    s = 2.0 * u - 1.0                              # exact in float64
    if role == "weight":
        v = s * math.sqrt(6.0 / fan_in(shape))
    elif role == "bias":
        v = s / math.sqrt(fan_in(weight_shape))
    elif role == "bn_weight":
        v = 1.0 + 0.2 * s
    elif role == "bn_bias":
        v = 0.2 * s
    elif role == "running_mean":
        v = 0.1 * s
    elif role == "running_var":
        v = 1.0 + 0.5 * u
    else:
        raise ValueError("unknown role %r for %s" % (role, name))
    return v.astype(np.float32).reshape(shape)     # one rounding float64 -> float32


def init_by_formula(model):
    """Overwrites every state_dict tensor of `model` with its formula value; returns the roles."""
    sd = model.state_dict()
    roles = tensor_roles(sd)
    # Cross-check the name rule against the module types.
    kinds = {}
    for mname, mod in model.named_modules():
        for pname, _ in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            kinds[(mname + "." if mname else "") + pname] = type(mod)
    for name, role in roles.items():
        bn = issubclass(kinds[name], nn.modules.batchnorm._BatchNorm)
        if bn != (role in ("bn_weight", "bn_bias", "running_mean", "running_var", "num_batches_tracked")):
            raise AssertionError("role rule disagrees with module type for %s" % name)
    with torch.no_grad():
        for name, t in sd.items():
            role = roles[name]
            wshape = None
            if role == "bias":
                wshape = tuple(sd[name.rpartition(".")[0] + ".weight"].shape)
            v = formula_values(name, role, tuple(t.shape), wshape)
            t.copy_(torch.from_numpy(v))   # state_dict tensors share storage with the module
    return roles
