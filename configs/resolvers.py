"""The resolvers a config may use beyond OmegaConf's own: ``${lr_times:R}``, R times the ``lr`` of the section it
stands in, so that a sweep of ``optimizer.lr`` can move a second rate in step with it at the ratio R
(``optimizer.lr_1d='${lr_times:0.5}'``, MARS's 1-D rate at half of each point's lr: docs/sweeps.md)."""
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError, UnsupportedInterpolationType


def lr_times(ratio, *, _parent_) -> float:
    """``ratio`` times the ``lr`` of the config section holding the key that asks."""
    return float(ratio) * float(_parent_["lr"])


def register_config_resolvers() -> None:
    """Register the resolvers, once per process: in train.py (with the schemas) and wherever a saved config is
    read back (reporting/run_reading.py)."""
    if not OmegaConf.has_resolver("lr_times"):
        OmegaConf.register_new_resolver("lr_times", lr_times)


def resolved_container(cfg) -> dict:
    """``cfg`` (a saved run config) as plain containers, its interpolations resolved as the run resolved them; as
    saved where one cannot be resolved here (a resolver of another program's), whose keys then hold its text."""
    register_config_resolvers()
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except (InterpolationResolutionError, UnsupportedInterpolationType):
        return OmegaConf.to_container(cfg)
