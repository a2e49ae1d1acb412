"""The PyTorch side of the overfit check: the same training steps as the port, from the same weights.

Both sides build the reference module under the case seed (in eval mode: dropout would make the two
runs differ by design), train it on one fixed batch for `steps` steps with the same loss and
optimizer, and golden compares the loss at every step and the final weights.
"""

from __future__ import annotations

from .evaluate import Case, ReferenceRaised, build_module, call


def _loss(torch, kind: str, outputs, targets):
    F = torch.nn.functional
    total = 0.0
    for (name, out), target in zip(outputs, targets):
        if kind == "mse":
            total = total + F.mse_loss(out, target)
        elif kind == "cross_entropy":
            total = total + F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        else:
            raise ValueError(f"unknown loss `{kind}`")
    return total


def _optimizer(torch, spec: dict, params):
    kind = spec["kind"]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=spec["lr"])
    if kind == "adamw":
        return torch.optim.AdamW(
            params,
            lr=spec["lr"],
            betas=(spec["beta1"], spec["beta2"]),
            eps=spec["eps"],
            weight_decay=spec["weight_decay"],
        )
    raise ValueError(f"unknown optimizer `{kind}`")


def train(case: Case, targets: list, loss: str, optimizer: dict, steps: int) -> dict:
    """Train the reference module; returns the loss before each step and the final state_dict."""
    backend = case.backend
    torch = backend.torch
    module = build_module(case)
    inputs = [backend.to_native(a) for a in case.args]
    targets = [backend.to_native(t) for t in targets]
    opt = _optimizer(torch, optimizer, list(module.parameters()))
    losses = []
    try:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with torch.enable_grad():
                # Driven as the forward check drives it: a submodule gets the position embeddings
                # and the mask its model builds.
                outputs = call(case, module, inputs, "training", grad=True)
                value = _loss(torch, loss, outputs, targets)
                value.backward()
            losses.append(float(value))
            opt.step()
    except ReferenceRaised:
        raise
    except Exception as e:
        raise ReferenceRaised("training", e) from None
    final = [(name, backend.from_native(t, case.dtype)) for name, t in module.state_dict().items()]
    return {"losses": losses, "final": final}
