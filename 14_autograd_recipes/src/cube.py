"""Stage 14, recipe 2: ``Cube``, a backward that is itself differentiable (double backward).

What this teaches: ``torch.autograd.grad(..., create_graph=True)`` records the *backward* as a
graph, so that it can be differentiated again (Hessian-vector products, gradient penalties).
Autograd records the operations a custom ``backward`` runs, but it cannot see what happened
inside ``forward`` (it runs with gradient recording off). Three versions of y = x^3,
dy/dx = 3 x^2, d/dx (g * 3 x^2) = 6 x g:

- ``CubeWrong``: ``forward`` computes 3 x^2 and saves it. The backward's result is right, so
  ``gradcheck`` passes, but the saved 3 x^2 carries no history back to x: the second derivative
  is silently missing (zero) and ``gradgradcheck`` fails. The same happens with anything the
  backward hides from autograd (``x.detach()``, numpy, ``.data``, a C++ kernel).
- ``Cube``: the backward is written with differentiable tensor operations on the saved *input*
  x, so autograd differentiates it again for free.
- ``CubeWithBackwardFunction``: the backward is a Function of its own (``CubeBackward``) with
  a hand-written backward: the route for a backward that autograd cannot trace (a kernel).

The example, and the names cube_forward, cube_backward and CubeBackward, are those of PyTorch's
tutorial "Double Backward with Custom Functions" (section "When Backward is not Tracked"); the
tutorial's Cube is CubeWithBackwardFunction here. CubeWrong is this stage's counter-example.

Run it: ``pip install --no-build-isolation .`` in 14_autograd_recipes, then ``pytest tests``.
"""

import torch


def cube_forward(x):
    return x ** 3


def cube_backward(grad_output, x):
    return grad_output * 3 * x ** 2  # dy/dx = 3 x^2


class CubeWrong(torch.autograd.Function):
    """y = x^3 whose double backward is silently wrong (kept as the counter-example)."""

    @staticmethod
    def forward(ctx, x):
        dx = 3 * x ** 2           # computed in forward: no autograd history, whatever x is
        ctx.save_for_backward(dx)
        return cube_forward(x)

    @staticmethod
    def backward(ctx, grad_output):
        (dx,) = ctx.saved_tensors
        return grad_output * dx   # right value; differentiable in grad_output only, not in x


class Cube(torch.autograd.Function):
    """y = x^3; the backward uses differentiable operations on x, so double backward works."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)  # save the input; recompute 3 x^2 in backward where autograd sees it
        return cube_forward(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return cube_backward(grad_output, x)


class CubeBackward(torch.autograd.Function):
    """g * 3 x^2 as a Function of (g, x), with its own hand-written backward."""

    @staticmethod
    def forward(ctx, grad_output, x):
        ctx.save_for_backward(grad_output, x)
        return cube_backward(grad_output, x)

    @staticmethod
    def backward(ctx, grad_grad_x):
        grad_output, x = ctx.saved_tensors
        # d(g * 3 x^2)/dg = 3 x^2;  d(g * 3 x^2)/dx = 6 x g  (each times the incoming gradient)
        return grad_grad_x * 3 * x ** 2, grad_grad_x * 6 * x * grad_output


class CubeWithBackwardFunction(torch.autograd.Function):
    """y = x^3 whose backward is the Function CubeBackward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return cube_forward(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return CubeBackward.apply(grad_output, x)


def double_backward_verdicts(x=None):
    """{name: (gradcheck passes, gradgradcheck passes)} for the three Cubes, float64."""
    if x is None:
        x = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    verdicts = {}
    for function in (CubeWrong, Cube, CubeWithBackwardFunction):
        first = torch.autograd.gradcheck(function.apply, (x,), raise_exception=False)
        second = torch.autograd.gradgradcheck(function.apply, (x,), raise_exception=False)
        verdicts[function.__name__] = (first, second)
    return verdicts


def tour_check():
    """(ok, line): gradgradcheck catches CubeWrong and passes the two right ones."""
    verdicts = double_backward_verdicts()
    expected = {"CubeWrong": (True, False), "Cube": (True, True), "CubeWithBackwardFunction": (True, True)}
    word = {True: "pass", False: "fail"}
    text = "; ".join(f"{name} {word[first]}/{word[second]}" for name, (first, second) in verdicts.items())
    return verdicts == expected, f"gradcheck/gradgradcheck float64: {text} (CubeWrong must fail the second)"
