"""A plain nn.Module that keeps state between calls, as a streaming vocoder's causal convolution
does: golden's schedules drive it with its own state (`tests/schedules.rs`)."""

import torch
from torch import nn


class StreamingConv(nn.Module):
    """A causal conv1d over [b, t, c] that streams: it keeps the last kernel-1 frames between calls."""

    def __init__(self, channels=4, kernel=3):
        super().__init__()
        self.kernel = kernel
        self.conv = nn.Conv1d(channels, channels, kernel)
        self.buffer = None

    def forward(self, x):
        x = x.transpose(1, 2)
        if self.buffer is None:
            self.buffer = torch.zeros(x.shape[0], x.shape[1], self.kernel - 1, dtype=x.dtype)
        full = torch.cat([self.buffer, x], dim=-1)
        self.buffer = full[..., -(self.kernel - 1):]
        return torch.nn.functional.gelu(self.conv(full)).transpose(1, 2)
