from .checkpoint import atomic_torch_save, cpu_state_dict

__all__: list[str] = ["atomic_torch_save", "cpu_state_dict"]
