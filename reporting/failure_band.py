"""Where the figures mark failed points: in a band above the axes, which no value can reach whatever the y range,
named on its left; marks at one x stack upwards, and the title stands above the band."""
import matplotlib.pyplot as plt

# In axes heights: the lowest mark, above the axes' top edge, and the spacing of the marks stacked at one x.
FAILED_BAND = 1.05
FAILED_SPACING = 0.05
FAILED_NOTE = "failed"  # the band's name, left of the axes


class FailedBand:
    """The failed marks of one axes: :meth:`mark` each, then :meth:`close` once every mark is drawn."""

    def __init__(self, axes: plt.Axes):
        self.axes, self.stacked = axes, {}

    def mark(self, x: float, marker: str, color) -> float:
        """Draw ``marker`` at data x ``x``, over the marks already there; returns its height (axes heights)."""
        height = FAILED_BAND + FAILED_SPACING * self.stacked.get(x, 0)
        self.stacked[x] = self.stacked.get(x, 0) + 1
        self.axes.plot([x], [height], transform=self.axes.get_xaxis_transform(), clip_on=False, linestyle="none",
                       marker=marker, markersize=8, color=color)
        return height

    def close(self) -> None:
        """Name the band and lift the title above it (nothing without a mark)."""
        if not self.stacked:
            return
        self.axes.text(-0.01, FAILED_BAND, FAILED_NOTE, transform=self.axes.transAxes, ha="right", va="center",
                       fontsize="small")
        self.axes.set_title(self.axes.get_title(), y=FAILED_BAND + FAILED_SPACING * (max(self.stacked.values()) - 0.5))
