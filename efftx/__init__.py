"""efftx: efficient token mixers side by side — does a Transformer really need attention?"""
