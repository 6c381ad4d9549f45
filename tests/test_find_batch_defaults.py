"""%%find_batch and colab_gpu.find_batch leave the notebook's model as it was by default.

A search of 15 trials ran 15 optimizer steps on the notebook's model when nothing was named
with --restore. Now the modules, optimizers, LR schedulers and GradScalers the cell (or the
step function) uses are found and restored after every trial; --no-restore (restore=False)
leaves them to the trials. Checked as a user would: every parameter and the optimizer's whole
state_dict() equal to before with torch.equal, and different with the opt-out.
"""
from __future__ import annotations

import types

import pytest

from colab_gpu.batch import RestoreError, find_batch, state

torch = pytest.importorskip("torch")

MiB = 1024 ** 2


@pytest.fixture(autouse=True)
def names_taken_back(ipython):
    """The names a test's cells bind are deleted after it: the shell is the whole session's,
    and a later test's ranking of the notebook's variables must not find these models."""
    before = set(ipython.user_ns)
    yield
    for name in set(ipython.user_ns) - before:
        del ipython.user_ns[name]



def same(a, b) -> bool:
    """Whether two state dicts (dicts, lists, tensors, numbers) hold equal values throughout."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def snapshot(model, optimizer):
    """Copies of every parameter and of the optimizer's state_dict(), to compare with later."""
    import copy

    return [p.detach().clone() for p in model.parameters()], copy.deepcopy(optimizer.state_dict())


def unchanged(model, optimizer, saved) -> bool:
    parameters, optimizer_state = saved
    return (all(torch.equal(p, q) for p, q in zip(model.parameters(), parameters))
            and same(optimizer.state_dict(), optimizer_state))


SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.1)
loss_fn = torch.nn.MSELoss()  # a module without parameters: nothing to restore, not listed
model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()  # Adam has state already

def train_step(bs):
    loss = loss_fn(model(torch.randn(bs, 8)), torch.zeros(bs, 1))
    loss.backward(); opt.step(); opt.zero_grad()
"""


@pytest.mark.parametrize("cell", [
    "train_step(batch_size)",  # the model and optimizer only as the function's globals
    "loss = model(torch.randn(batch_size, 8)).pow(2).mean()\nloss.backward(); opt.step(); opt.zero_grad()",
])
def test_a_search_leaves_the_model_and_its_optimizer_as_they_were_and_no_restore_does_not(shell, cell):
    shell.run_cell(SETUP)
    ns = shell.user_ns
    saved = snapshot(ns["model"], ns["opt"])
    result = shell.run_cell_magic("find_batch", "--max 64 -o", cell)
    assert len(result.trials) >= 3 and result.answer == 64
    assert unchanged(ns["model"], ns["opt"], saved)
    assert "restored after every trial: model, opt (--no-restore leaves what the cell uses as the " \
           "trials change it)" in result.notes
    assert "restored after every trial: model, opt" in str(result)  # the report says so, one line

    result = shell.run_cell_magic("find_batch", "--max 64 --no-restore -o", cell)
    assert not unchanged(ns["model"], ns["opt"], saved)  # the trials trained it
    assert not any(note.startswith("restored") for note in result.notes)
    assert not any(torch.equal(p, q) for p, q in zip(ns["model"].parameters(), saved[0]))


def test_python_api_restores_what_the_step_reads_and_restore_false_or_none_does_not():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)

    def make_step(model, opt, sched):  # a closure: nothing in the globals
        def step(bs):
            model(torch.randn(bs, 8)).sum().backward(); opt.step(); opt.zero_grad(); sched.step()
        return step

    step = make_step(model, opt, sched)
    saved = snapshot(model, opt)
    result = find_batch(step, max=64, progress=False)
    assert unchanged(model, opt, saved) and sched.last_epoch == 0
    assert opt.param_groups[0]["lr"] == 0.1  # the rate the schedule wrote, put back with it
    assert "restored after every trial: model, opt, sched (restore=False leaves what the step uses " \
           "as the trials change it)" in result.notes
    for off in (False, None):
        find_batch(step, max=8, progress=False, restore=off)
        assert not unchanged(model, opt, saved)
        model.load_state_dict(dict(zip(("weight", "bias"), saved[0])))
        opt.load_state_dict(saved[1])


def test_objects_given_are_restored_with_those_found(shell):
    """restore=[...] adds to what is found: a hand-trained tensor and the model alike."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    w = torch.zeros(3)
    saved = [p.detach().clone() for p in model.parameters()]

    def step(bs):
        w.add_(bs)
        model.weight.data.add_(1)

    result = find_batch(step, max=8, progress=False, restore=[w])
    assert torch.equal(w, torch.zeros(3)) and all(torch.equal(p, q) for p, q in zip(model.parameters(), saved))
    assert result.notes[0].startswith("restored after every trial: restore[0], model (")


def test_objects_one_level_inside_what_the_cell_reads_are_found(shell):
    """A trainer object, a dict of parts, a scheduler's optimizer, a GradScaler; a layer of a
    model already restored is restored with it, not twice."""
    shell.run_cell(
        "import torch, types\ntorch.manual_seed(0)\n"
        "net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))\nhead = net[1]\n"
        "trainer = types.SimpleNamespace(model=net, opt=torch.optim.SGD(net.parameters(), lr=0.1))\n"
        "parts = {'sched': torch.optim.lr_scheduler.ExponentialLR(trainer.opt, 0.5),"
        " 'scaler': torch.amp.GradScaler('cpu')}\n"
        "before = [p.detach().clone() for p in net.parameters()]")
    result = shell.run_cell_magic(
        "find_batch", "--max 16 -o",
        "loss = trainer.model(torch.randn(batch_size, 4)).sum() + head.bias.sum()\n"
        "parts['scaler'].scale(loss).backward(); parts['scaler'].step(trainer.opt)\n"
        "parts['scaler'].update(4.0); parts['sched'].step(); trainer.opt.zero_grad()")
    ns = shell.user_ns
    assert result.notes[0].startswith("restored after every trial: trainer.model, trainer.opt, "
                                      "parts['sched'], parts['scaler'] (")
    assert all(torch.equal(p, q) for p, q in zip(ns["net"].parameters(), ns["before"]))
    assert ns["parts"]["scaler"].get_scale() == 65536.0 and ns["parts"]["sched"].last_epoch == 0
    assert ns["trainer"].opt.param_groups[0]["lr"] == 0.1


def test_what_does_not_fit_in_ram_is_named_and_not_restored(shell, monkeypatch):
    """A copy the RAM cannot hold would get the kernel killed: the model is left to the trials,
    and the report says so; named with --restore, it is refused before anything runs."""
    from IPython.core.error import UsageError

    shell.run_cell(SETUP + "\nbig = torch.nn.Linear(1024, 1024)\n")  # 4 MiB of weights
    ns = shell.user_ns
    monkeypatch.setattr(state, "ram_available", lambda: 2 * MiB)  # room for opt's and model's, not big's
    result = shell.run_cell_magic("find_batch", "--max 8 -o", "big.weight.data += 1\ntrain_step(batch_size)")
    assert result.notes[:2] == (
        ("restored after every trial: model, opt (--no-restore leaves what the cell uses as the trials "
         "change it)"),
        ("not restored, so each trial changes it: big (4 MiB): a CPU copy would not fit in the RAM "
         "available now (2 MiB, of which the copies may take 75%)"))
    assert ns["big"].weight.data.min() > 1  # trained: each trial added one
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("find_batch", "--max 8 --restore big", "big.weight.data += 1")
    assert str(refused.value) == ("--restore big: a CPU copy of 4 MiB would not fit in the RAM available "
                                  "now (2 MiB, of which the copies may take 75%); free RAM or restore "
                                  "less; nothing ran")
    with pytest.raises(RestoreError, match=r"^restore\[0\]: a CPU copy of 4 MiB would not fit"):
        find_batch(lambda size: None, restore=[ns["big"]], progress=False)


def test_the_finder_follows_the_users_functions_not_a_librarys():
    """What a step reads through its own helpers, a partial's arguments, a bound method's object
    and a callable object's attributes; a library's module globals are not searched."""
    import functools

    from colab_gpu.batch.state import stateful_objects

    model, opt_model = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(opt_model.parameters(), lr=0.1)
    home = {"model": model, "torch": torch}
    exec("def helper(bs):\n    return model(torch.zeros(bs, 2))\n"
         "def step(bs):\n    return helper(bs)\n", home)
    assert list(stateful_objects([("step", home["step"])], home=[home])) == ["model"]

    def update(bs, optimizer):
        optimizer.step()
    assert list(stateful_objects([("fn", functools.partial(update, optimizer=opt))])) == \
        ["fn.keywords['optimizer']"]

    class Trainer:
        def __init__(self):
            self.net, self.lr = model, 0.1

        def __call__(self, bs):
            return self.net(torch.zeros(bs, 2))

        def step(self, bs):
            return self(bs)

    trainer = Trainer()
    assert list(stateful_objects([("trainer", trainer)])) == ["trainer.net"]
    assert list(stateful_objects([("fit", trainer.step)])) == ["fit.__self__.net"]
    # torch.nn.functional's globals hold no model; a library function is not followed into them.
    assert stateful_objects([("relu", torch.nn.functional.relu), ("np", types)]) == {}


def test_a_cell_that_builds_its_model_does_not_copy_the_notebooks_old_one(shell):
    """``model = Net()`` on the cell's first line: the notebook's ``model`` of an earlier run is
    not what the trials train, and a CPU copy of it would cost RAM for nothing."""
    shell.run_cell("import torch\nmodel = torch.nn.Linear(256, 256)\nold = model")
    result = shell.run_cell_magic("find_batch", "--max 8 -o",
                                  "model = torch.nn.Linear(8, 1)\nmodel(torch.randn(batch_size, 8)).sum().backward()")
    assert not any(note.startswith("restored") for note in result.notes)
    assert shell.user_ns["model"] is shell.user_ns["old"]  # the name put back, as always
