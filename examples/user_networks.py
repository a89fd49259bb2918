"""Networks written as everyone writes them, for activations ``(batch, ...)``.

pyro_bbb makes each of them Bayesian with no change to its code (``examples/any_network.py``
shows two; the tests and ``benchmarks/steptime.py`` use all of them):

* ``ResNet``: torchvision's ``BasicBlock`` / ``ResNet`` structure (``conv1``, ``bn1``,
  ``layer1``..., a ``downsample`` branch, ``torch.flatten(x, 1)`` before ``fc``), narrowed to
  two stages of one block and 16 channels so that it trains on a CPU in seconds;
* ``Recurrent``: an ``nn.LSTM`` (or ``nn.GRU``) read at its last step, ``out[:, -1]``;
* ``ConvView``: a convolution, then ``h.view(h.size(0), -1)``;
* ``TokenTransformer``: ``nn.Embedding`` and ``nn.TransformerEncoderLayer(batch_first=True)``
  read at ``h[:, 0]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


# --8<-- [start:resnet]
def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, layers=(1, 1), num_classes=10, width=16):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(2 * width, layers[1], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2 * width * BasicBlock.expansion, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * BasicBlock.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * BasicBlock.expansion
        layers += [BasicBlock(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


# --8<-- [end:resnet]


class Recurrent(nn.Module):
    """An LSTM (or GRU) read at its last step, ``out[:, -1]``."""

    def __init__(self, cell=nn.LSTM, features=3, hidden=8):
        super().__init__()
        self.rnn = cell(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class ConvView(nn.Module):
    """A convolution, then ``h.view(h.size(0), -1)``."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 3 * 3, classes)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(h.view(h.size(0), -1))


class TokenTransformer(nn.Module):
    """``Embedding`` + ``TransformerEncoderLayer(batch_first=True)`` read at ``h[:, 0]``."""

    def __init__(self, vocab=20, d_model=16, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.encoder = nn.TransformerEncoderLayer(
            d_model, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens))
        return self.head(h[:, 0])
