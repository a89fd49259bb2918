"""Everything a user does with a BNN works on networks written for activations ``(batch, ...)``.

The networks of ``examples/user_networks.py`` (a ``view(h.size(0), -1)`` ConvNet, a GRU read at
``out[:, -1]``, an embedding and transformer layer on token ids) through ``only=`` and
``deterministic=``, centred priors and MOPED, save and load, a checkpointed and resumed fit,
ArviZ export and NUTS; :mod:`tests.nn.test_draws` checks their fits and predictive draws.
"""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.infer.guides import MOPED
from pyro_bbb.nn.draws import DrawPath, draw_path

from .support import user_networks

ROWS = 24


def _case(name):
    g = torch.Generator().manual_seed(2)
    if name == "conv_view":
        net, x = user_networks.ConvView(), torch.randn(ROWS, 1, 8, 8, generator=g)
        return net, x, torch.randint(0, 3, (ROWS,), generator=g), bbb.likelihoods.Categorical(3)
    if name == "gru":
        net, x = user_networks.Recurrent(nn.GRU, hidden=6), torch.randn(ROWS, 5, 3, generator=g)
        return net, x, torch.randn(ROWS, generator=g), bbb.likelihoods.Gaussian()
    net = user_networks.TokenTransformer(vocab=12, d_model=8)
    x = torch.randint(0, 12, (ROWS, 4), generator=g)
    return net, x, torch.randint(0, 3, (ROWS,), generator=g), bbb.likelihoods.Categorical(3)


NAMES = ["conv_view", "gru", "transformer"]
OPTIONS = {"epochs": 2, "num_particles": 2, "batch_size": 12, "progress": False}


@pytest.mark.parametrize("name", NAMES)
def test_chosen_layers_centred_priors_and_moped_train_on_a_network_of_ones_own(name):
    pyro.clear_param_store()
    torch.manual_seed(0)
    plain, x, y, likelihood = _case(name)
    head_only = bbb.bayesianize(plain, only="head.*" if name != "conv_view" else "fc.*")
    model = bbb.BNN(head_only, likelihood, num_data=ROWS)
    assert {p.name.split(".")[0] for p in model.summary().bayesian} <= {"head", "fc"}
    bbb.fit(model, bbb.MeanFieldGuide(model), x, y, seed=0, **OPTIONS)
    pyro.clear_param_store()
    net = bbb.bayesianize(plain, deterministic="*.bias", centre_priors=True)
    model = bbb.BNN(net, likelihood, num_data=ROWS)
    guide = bbb.MeanFieldGuide(model, init_loc=plain, init_scale=MOPED(0.1))
    history = bbb.fit(model, guide, x, y, seed=0, **OPTIONS)
    assert all(p.prior.endswith("centred on the initial value") for p in model.summary().bayesian)
    assert torch.isfinite(torch.tensor(history.loss)).all()
    assert draw_path(net).path in (DrawPath.VMAP, DrawPath.LOOP)


@pytest.mark.parametrize("name", NAMES)
def test_save_load_and_a_resumed_fit_give_what_the_fitted_model_gives(name, tmp_path):
    def build():
        pyro.clear_param_store()
        torch.manual_seed(0)
        plain, x, y, likelihood = _case(name)
        model = bbb.BNN(bbb.bayesianize(plain), likelihood, num_data=ROWS)
        return model, bbb.MeanFieldGuide(model), x, y

    model, guide, x, y = build()
    whole = bbb.fit(model, guide, x, y, seed=0, **{**OPTIONS, "epochs": 3})
    expected = bbb.predict(model, guide, x, num_samples=4, seed=1).samples
    bbb.save(tmp_path / "fitted.pt", model, guide)
    model, guide, x, y = build()
    bbb.load(tmp_path / "fitted.pt", model, guide)
    torch.testing.assert_close(
        bbb.predict(model, guide, x, num_samples=4, seed=1).samples, expected
    )

    class StopAfterTwo(bbb.Callback):
        def on_epoch_end(self, epoch, history):
            return epoch == 1

    options = {**OPTIONS, "epochs": 3, "seed": 0}
    model, guide, x, y = build()
    bbb.fit(
        model, guide, x, y, checkpoint=tmp_path / "ck.pt", callbacks=[StopAfterTwo()], **options
    )
    model, guide, x, y = build()
    resumed = bbb.fit(model, guide, x, y, resume=tmp_path / "ck.pt", **options)
    assert resumed.loss == whole.loss


def test_nuts_and_arviz_run_on_a_network_of_ones_own():
    pyro.clear_param_store()
    torch.manual_seed(0)
    plain, x, y, likelihood = _case("conv_view")
    model = bbb.BNN(bbb.bayesianize(plain), likelihood, num_data=ROWS)
    guide = bbb.MeanFieldGuide(model)
    bbb.fit(model, guide, x, y, seed=0, **OPTIONS)
    vi = bbb.to_inference_data(model, guide, x, y, num_samples=8, seed=0)
    assert vi.posterior["fc.weight"].shape[-2:] == (3, 36)
    result = bbb.run_nuts(
        model, x, y, num_samples=4, warmup_steps=4, seed=0, progress=False, init="prior",
        max_tree_depth=3, jit_compile=False,
    )  # fmt: skip
    nuts = bbb.to_inference_data(model, result, x, y)
    assert set(vi.posterior.data_vars) == set(nuts.posterior.data_vars)
    assert torch.isfinite(torch.as_tensor(nuts.log_likelihood["obs"].values)).all()
