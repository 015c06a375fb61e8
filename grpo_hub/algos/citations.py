"""BibTeX of the papers behind the loss types (grpo_hub.algos.loss_types), as model cards cite them."""

DEEPSEEKMATH = """@article{shao2024deepseekmath,
    title   = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
    author  = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Mingchuan Zhang and Y. K. Li and Y. Wu and Daya Guo},
    year    = 2024,
    eprint  = {arXiv:2402.03300},
}"""
DAPO = """@article{yu2025dapo,
    title   = {{DAPO: An Open-Source LLM Reinforcement Learning System at Scale}},
    author  = {Qiying Yu and others},
    year    = 2025,
    eprint  = {arXiv:2503.14476},
}"""
DR_GRPO = """@article{liu2025understanding,
    title   = {{Understanding R1-Zero-Like Training: A Critical Perspective}},
    author  = {Zichen Liu and others},
    year    = 2025,
    eprint  = {arXiv:2503.20783},
}"""
GSPO = """@article{zheng2025gspo,
    title   = {{Group Sequence Policy Optimization}},
    author  = {Chujie Zheng and others},
    year    = 2025,
    eprint  = {arXiv:2507.18071},
}"""
CISPO = """@article{minimax2025m1,
    title   = {{MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention}},
    author  = {{MiniMax}},
    year    = 2025,
    eprint  = {arXiv:2506.13585},
}"""
