"""Distances between predictives: W2, total variation, agreement, label-set coverage."""

from __future__ import annotations

import math

import pytest
import torch

from pyro_bbb.evaluation import (
    label_set_coverage,
    top1_agreement,
    total_variation,
    wasserstein2,
)


def test_wasserstein2_of_gaussian_samples_matches_the_closed_form():
    # W2(N(m1, s1²), N(m2, s2²))² = (m1 - m2)² + (s1 - s2)²
    g = torch.Generator().manual_seed(0)
    a = 1.0 + 2.0 * torch.randn(20000, 3, generator=g)
    b = -0.5 + 0.5 * torch.randn(30000, 3, generator=g)
    expected = math.sqrt(1.5**2 + 1.5**2)
    assert torch.allclose(
        wasserstein2(a, b), torch.full((3,), expected, dtype=torch.float64), rtol=0.02
    )


def test_wasserstein2_is_exact_on_small_sets():
    # {0, 1} against {0, 1, 2}: quantile steps on [0,1/3), [1/3,1/2), [1/2,2/3), [2/3,1)
    a = torch.tensor([[0.0], [1.0]])
    b = torch.tensor([[2.0], [0.0], [1.0]])
    # differences 0, 1, 0, 1 on widths 1/3, 1/6, 1/6, 1/3
    assert wasserstein2(a, b).item() == pytest.approx(math.sqrt(1 / 6 + 1 / 3))
    assert wasserstein2(a, a).item() == 0.0
    shifted = wasserstein2(a + 0.3, a)
    assert shifted.item() == pytest.approx(0.3)


def test_total_variation_and_agreement_of_known_probabilities():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3]])
    q = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.2, 0.3]])
    assert torch.allclose(total_variation(p, q), torch.tensor([0.1, 0.3]))
    assert torch.equal(top1_agreement(p, q), torch.tensor([1.0, 0.0], dtype=torch.float64))
    binary = total_variation(torch.tensor([0.9, 0.4]), torch.tensor([0.6, 0.6]), binary=True)
    assert torch.allclose(binary, torch.tensor([0.3, 0.2]))


def test_label_set_coverage():
    probs = torch.tensor([[0.96, 0.03, 0.01], [0.5, 0.4, 0.1], [0.5, 0.4, 0.1]])
    # point 0: set {0}; points 1, 2: set {0, 1, 2} (0.5 + 0.4 < 0.95)
    y = torch.tensor([1, 2, 0])
    assert label_set_coverage(probs, y) == pytest.approx(2 / 3)
    assert label_set_coverage(probs, torch.tensor([0, 2, 0]), level=0.5) == pytest.approx(2 / 3)
