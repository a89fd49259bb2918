"""Quick start: fit a Bayesian MLP to 1-D data with a gap, print its uncertainty, plot its bands."""

import pyro
import torch

import pyro_bbb
from pyro_bbb.plots import plot_regression_bands  # figures need matplotlib

torch.manual_seed(0)
torch.set_num_threads(1)  # small nets run fastest on one thread
x = torch.cat([torch.rand(500, 1) * 3 - 4, torch.rand(500, 1) * 3 + 1])  # (N, 1), gap (-1, 1)
y = torch.sin(x).squeeze(-1) + 0.1 * torch.randn(1000)  # (N,)

pyro.clear_param_store()  # guide parameters live in Pyro's param store
prior = pyro_bbb.priors.ScaleMixture(pi=0.5, sigma1=1.0, sigma2=0.0025)  # KL by Monte Carlo
net = pyro_bbb.mlp([1, 50, 50, 1], activation="tanh", prior=prior)  # sites "0.weight", ...
model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(), num_data=len(x))  # learned noise
guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.01)
history = pyro_bbb.fit(  # reparam=None (the default) samples the weights
    model, guide, x, y, batch_size=100, seed=0
)
print(
    f"loss {history.loss[-1]:.1f}  nll {history.nll[-1]:.1f}  kl {history.kl[-1]:.1f}  "
    f"beta {history.beta[-1]:.2f}  {len(history)} epochs  {sum(history.seconds):.1f} s"
)

x_test = torch.tensor([[-2.5], [0.0], [6.0]])  # near the data, in the gap, extrapolation
pred = pyro_bbb.predict(model, guide, x_test, num_samples=200, seed=0)
lower, upper = pred.interval(0.95)
torch.set_printoptions(precision=2)
print("mean", pred.mean, "std", pred.std)
print("epistemic", pred.epistemic_std, "aleatoric", pred.aleatoric_std)
print("95% interval", lower, upper)

x_grid = torch.linspace(-7, 7, 281).unsqueeze(-1)  # the data, the gap and beyond
grid = pyro_bbb.predict(model, guide, x_grid, num_samples=200, seed=0)
plot_regression_bands(
    x, y, x_grid, grid.mean, grid.epistemic_std, grid.std, true_fn=torch.sin, path="quickstart.png"
)
