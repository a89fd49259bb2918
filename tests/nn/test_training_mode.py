import pyro.nn
from torch import nn

from pyro_bbb.nn.training_mode import module_class_name, module_in_training_mode


def test_the_first_module_in_training_mode_is_named_with_its_class():
    net = nn.Sequential(nn.Linear(2, 3), nn.Dropout(0.1), nn.BatchNorm1d(3))
    assert module_in_training_mode(net) == "'1' (Dropout)"
    net[1].eval()
    assert module_in_training_mode(net) == "'2' (BatchNorm1d)"


def test_a_network_in_evaluation_mode_or_without_such_modules_is_a_function_of_its_weights():
    assert module_in_training_mode(nn.Sequential(nn.Dropout(), nn.InstanceNorm1d(3)).eval()) is None
    assert module_in_training_mode(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) is None


def test_a_pyro_module_is_named_by_the_torch_class_it_wraps():
    assert module_class_name(pyro.nn.PyroModule[nn.Dropout](0.5)) == "Dropout"
